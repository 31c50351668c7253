"""`dspark synth` and `dspark synth-predict` as a user runs them (subprocess)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dsparkcli.synth import known_answer as synth


def test_synth_writes_a_pair_and_reports_it(cli, tmp_path):
    proc = cli("synth", str(tmp_path / "pair"), "--accept-rate", "0.7", "--seed", "2", "--confidence", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["wrong_rows"] == 38  # round(0.3 * 128)
    assert doc["correct_fraction"] == pytest.approx(90 / 128)
    assert doc["confidence"] is True and doc["pair"]["mmproj"] is None
    man = synth.load_manifest(doc["pair"]["manifest"])
    assert man.seed == 2 and len(man.wrong_rows) == 38
    synth.verify_files(man)


def test_synth_human_output_names_files_and_next_step(cli, tmp_path):
    proc = cli("synth", str(tmp_path), "--vision", "--vocab", "64", "--block-size", "4")
    assert proc.returncode == 0, proc.stderr
    flat = "".join(proc.stdout.split())  # long paths may wrap
    for name in ("target-llama.gguf", "draft-dspark.gguf", "mmproj-mlp.gguf", "image.png", "manifest.json"):
        assert str(tmp_path / name) in flat
        assert (tmp_path / name).is_file()
    assert "vocab 64, block size 4, 0 of 64 Markov rows wrong" in proc.stdout
    assert "dspark synth-predict" in proc.stdout


def test_synth_predict_json_equals_the_library(cli, tmp_path):
    pair = synth.write_pair(tmp_path, accept_rate=0.5, seed=6, confidence=True)
    man = synth.load_manifest(pair.manifest)
    proc = cli(
        "synth-predict",
        str(pair.manifest),
        "--prompt-tokens",
        "4,5,6",
        "--n-max",
        "5",
        "--n-predict",
        "20",
        "--p-min",
        "0.5",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    expected = synth.predict(man, [4, 5, 6], n_max=5, n_predict=20, p_min=0.5)
    assert json.loads(proc.stdout) == json.loads(json.dumps(dataclasses.asdict(expected)))
    proc = cli(
        "synth-predict",
        str(tmp_path),
        "--last-token",
        "6",
        "--n-max",
        "5",
        "--n-predict",
        "20",
        "--p-min",
        "0.5",
        "--json",
    )
    assert json.loads(proc.stdout)["tokens"] == list(expected.tokens)


def test_synth_predict_table(cli, tmp_path):
    synth.write_pair(tmp_path)  # accept rate 1: every drafted token is accepted
    proc = cli("synth-predict", str(tmp_path), "--last-token", "0", "--n-max", "7", "--n-predict", "17")
    assert proc.returncode == 0, proc.stderr
    # 1 token from the prompt, then 7 + 1 and 7 + 1 more: 2 steps, 14 drafted, 14 accepted, mean length 8
    assert "draft_n             14" in proc.stdout
    assert "verification steps  2" in proc.stdout
    assert "mean len            8.00" in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("synth", "{d}", "--accept-rate", "2"), "--accept-rate must be between 0 and 1"),
        (("synth", "{d}", "--vocab", "3"), "--vocab must be between"),
        (("synth-predict", "{d}/missing.json", "--last-token", "1"), "manifest not found"),
        (("synth-predict", "{d}/pair", "--prompt-tokens", "1,x"), "comma-separated token ids"),
        (("synth-predict", "{d}/pair", "--prompt-tokens", "1", "--last-token", "1"), "exactly one of"),
        (("synth-predict", "{d}/pair", "--last-token", "1", "--p-min", "0.3"), "confidence head"),
        (("synth-predict", "{d}/pair", "--last-token", "999"), "outside the synthetic vocab"),
    ],
)
def test_errors_are_one_line_with_exit_2(cli, tmp_path, args, message):
    synth.write_pair(tmp_path / "pair")
    proc = cli(*(a.format(d=tmp_path) for a in args))
    assert proc.returncode == 2
    assert proc.stderr.strip() == proc.stderr.strip().splitlines()[-1]  # one line
    assert proc.stderr.startswith("dspark: error: ") and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_shape_is_a_clean_error(cli, tmp_path):
    proc = cli("synth", str(tmp_path), "--shape", "no-such-model")
    assert proc.returncode != 0
    assert proc.stderr.startswith("dspark: error: ") and "Traceback" not in proc.stderr


def test_shape_names_the_known_shapes(cli, tmp_path):
    """--shape reaches synth.full_width (no "not available in this install" fallback for a module that ships)."""
    proc = cli("synth", str(tmp_path), "--shape", "no-such-model")
    assert proc.returncode == 2
    assert "unknown shape 'no-such-model'; choose one of minicpm-v-4.7-35b-a3b" in proc.stderr


@pytest.mark.parametrize("command", ["synth", "synth-predict"])
def test_help_has_examples(cli, command):
    proc = cli(command, "--help")
    assert proc.returncode == 0
    assert "Examples:" in proc.stdout
    # \b keeps each example on its own line instead of rewrapping them into one paragraph
    assert sum(line.strip().startswith(f"dspark {command} ") for line in proc.stdout.splitlines()) >= 3
