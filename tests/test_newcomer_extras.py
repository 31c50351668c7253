"""What users expect to find (issue 40): shell completion, `engine path --json`, and where doctor says the
server logs go and how many are kept."""

from __future__ import annotations


def test_show_completion_prints_a_script_that_completes_commands_and_options(cli):
    """`--install-completion` was "No such option". The script --show-completion prints calls dspark back
    with _DSPARK_COMPLETE set; those calls complete a subcommand and a command's own option."""
    script = cli("--show-completion", "bash")
    assert script.returncode == 0, script.stderr
    assert "_DSPARK_COMPLETE=complete_bash" in script.stdout and "complete -o default -F" in script.stdout

    def complete(words: str) -> list[str]:
        proc = cli(
            env={"_DSPARK_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert complete("dspark eng") == ["engine"]
    assert complete("dspark engine pa") == ["path"]
    assert complete("dspark run --no-dr") == ["--no-draft"]
    assert "--install-completion" in cli("--help").stdout
