"""What a new user hit besides the demo (issue 28, item 11): Pillow's warning before dspark's line, bars for
files already here, an empty first line on stderr, `--out /proc/version`, a plot written before the table,
and "lost during generation" for a server that was never reached. Run as a user would: `dspark` in a
subprocess (a pty where a terminal matters), the real engine and the real hub client against FakeHub."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from dsparkcli.synth import known_answer as synth
from support.cli import REPO
from support.terminal import on_a_terminal

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def _one_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The whole of stderr: one `dspark: error:` line, nothing before it, the given exit code."""
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error: "), proc.stderr
    return lines[0]


# ------------------------------------------------------------------ a: Pillow's warning


def test_a_huge_image_is_one_line_without_pillows_warning(cli, tmp_path):
    """10000x10000 is above Pillow's own limit (89.5 M pixels), which printed a two-line
    DecompressionBombWarning before dspark's line; dspark's limit is lower and says it alone."""
    big = tmp_path / "big.png"
    Image.new("1", (10000, 10000)).save(big)  # bilevel and blank: a few kB on disk
    # port 9 has no server: the image is refused before any connection
    line = _one_line(cli("run", str(big), "describe it", "--server", "http://127.0.0.1:9"), 2)
    assert line == f"dspark: error: image too large: {big} is 10000x10000 pixels"


# ------------------------------------------------------------------ b, c: bars and stderr's first line


REGISTRY = """
[pairs.synthpair]
default_draft = "d"
budget = 4
[pairs.synthpair.target]
repo = "o/t"
filename = "target-llama.gguf"
[pairs.synthpair.drafts.d]
repo = "o/d"
filename = "draft-dspark.gguf"
"""


@pytest.fixture
def hub_env(tmp_path, engine, user_models):
    """A synthetic pair served by FakeHub under a registry name, an empty HF cache, the real engine."""
    from support.hubserver import FakeHub

    pair = synth.write_pair(tmp_path / "pair", vocab=64, seed=4)
    with FakeHub() as hub:
        hub.add_file("o/t", "target-llama.gguf", pair.target.read_bytes())
        hub.add_file("o/d", "draft-dspark.gguf", pair.draft.read_bytes())
        yield {
            **hub.client_env(tmp_path / "hf"),
            "DSPARK_CONFIG_DIR": str(user_models(REGISTRY)),
            "DSPARK_LLAMA_BIN": str(engine.server),
        }


def _shown(args: list[str], *, env: dict[str, str]) -> tuple[int, str]:
    rc, shown = on_a_terminal(args, env={"COLUMNS": "200", "TERM": "xterm", **env})
    return rc, ANSI.sub("", shown)


def test_no_bar_for_files_already_here_and_no_empty_line_off_a_terminal(cli, hub_env):
    args = ["run", "--model", "synthpair", "-t", "1", "--ctx", "256", "--max-tokens", "8", "--yes", "hi"]
    first = cli(*args, env=hub_env, timeout=120)  # downloads both files, stderr to a pipe
    assert first.returncode == 0, first.stderr
    again = cli(*args, env=hub_env, timeout=120)  # both present and verified before
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    for proc in (first, again):  # stderr began with the empty line a bar leaves off a terminal
        assert proc.stderr.strip() and "" not in proc.stderr.splitlines(), proc.stderr
    assert again.stderr.splitlines()[0].startswith("loading target-llama.gguf"), again.stderr
    rc, shown = _shown(args, env=hub_env)
    assert rc == 0, shown
    assert "loading target-llama.gguf" in shown
    assert "fetching" not in shown and "verifying" not in shown, shown  # no bar for a file nothing was done to


def test_a_bar_is_still_drawn_for_a_download_on_a_terminal(hub_env):
    rc, shown = _shown(["fetch", "synthpair", "--yes"], env=hub_env)
    assert rc == 0, shown
    assert "fetching target" in shown and "fetching draft" in shown, shown
    rc, shown = _shown(["fetch", "synthpair", "--yes"], env=hub_env)
    assert rc == 0 and "present" in shown, shown
    assert "fetching" not in shown and "verifying" not in shown, shown


# ------------------------------------------------------------------ d: an output dspark cannot write


@pytest.mark.parametrize(
    "flag,path", [("--out", "/proc/version"), ("--out", "/proc/dspark.jsonl"), ("--plot", "/sys/kernel/bench.png")]
)
def test_an_output_in_a_kernel_filesystem_is_a_usage_error(cli, flag, path):
    """`bench --out /proc/version` opened the file after the run and said `Invalid argument`, exit 1 (root's
    access() says yes there); now the one output check refuses it up front: one line, exit 2."""
    folder = Path(path).parent
    line = _one_line(cli("bench", flag, path, "--target", "t.gguf", "--draft", "d.gguf"), 2)
    assert (
        line
        == f"dspark: error: {flag} {path}: {folder} is a kernel filesystem (like /proc, /sys): nothing written there is kept"
    )


# ------------------------------------------------------------------ e: the table before the plot


def test_a_full_disk_at_the_plot_loses_no_table(engine, tmp_path):
    """The plot was written before the table, so a disk that filled up lost the table. The plot's writer
    meets a full disk (ENOSPC, as savefig would); the bench itself is real."""
    pair = synth.write_pair(tmp_path / "pair", vocab=64, seed=4)
    out, plot = tmp_path / "r.jsonl", tmp_path / "bench.png"
    full_disk = (
        "import errno, os, sys\n"
        "from pathlib import Path\n"
        "from dsparkcli.bench import report\n"
        "def plot(summaries, path, provenance=None):\n"
        "    Path(path).write_bytes(b'\\x89PNG')\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))\n"
        "report.plot = plot\n"
        "from dsparkcli.cli.app import main\n"
        "main(sys.argv[1:])\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            full_disk,
            "bench",
            "--target",
            str(pair.target),
            "--draft",
            str(pair.draft),
            "--budget",
            "2",
            "--category",
            "code",
            "--limit",
            "1",
            "--reps",
            "1",
            "-n",
            "16",
            "-t",
            "1",
            "--ctx",
            "256",
            "--out",
            str(out),
            "--plot",
            str(plot),
            "--format",
            "md",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "DSPARK_LLAMA_BIN": str(engine.server)},
    )
    assert proc.returncode == 6, proc.stderr
    assert (
        proc.stderr.splitlines()[-1]
        == f"dspark: error: disk full while writing {plot}: free space and run the command again"
    )
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ")]
    assert [r.split("|")[1:3] for r in rows[1:]] == [
        [" plain ", " code "],
        [" plain ", " all "],
        [" draft-dspark@2 ", " code "],
        [" draft-dspark@2 ", " all "],
    ]
    assert f"records: {out}" in proc.stderr and '"record":"summary"' in out.read_text()


# ------------------------------------------------------------------ f: a server never reached


def test_a_server_url_nothing_listens_on_is_could_not_connect(cli):
    """`run --server URL` with nothing there said "connection to llama-server lost during generation"."""
    with socket.socket() as s:  # a port that was free a moment ago and is closed now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    line = _one_line(cli("run", "hi", "--server", url, "--max-tokens", "4"), 4)
    assert line.startswith(f"dspark: error: could not connect to {url}: ConnectError: "), line
    assert "lost during generation" not in line and "`dspark serve` starts one" in line
