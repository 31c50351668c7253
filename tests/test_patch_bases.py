"""Each llama.cpp base dspark has a patch series for: the BASE file beside the series names the tree it was
made on (its git tree hash equals the pinned sdist's tree as dspark downloads it), the series applies there
and makes the same changes, and a rebased series is reproducible (its base commit remade from the recorded
tree and message, the series re-applied and re-generated with ``git format-patch --base``: byte for byte)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dsparkcli.llama import patches, sources

BASES = [pytest.param(s, id=s.release) for s in sources.SDISTS]
GIT_ID = {
    "GIT_AUTHOR_NAME": "dspark",
    "GIT_AUTHOR_EMAIL": "dspark@localhost",
    "GIT_COMMITTER_NAME": "dspark",
    "GIT_COMMITTER_EMAIL": "dspark@localhost",
}


def _git(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | (env or {})
    proc = subprocess.run(["git", *args], capture_output=True, text=True, env=full, cwd=cwd, check=False)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr.strip()}"
    return proc.stdout.strip()


def _tree_hash(tree: Path, git_dir: Path) -> str:
    """`git write-tree` of every file of ``tree`` as it lies (ignore files ignored: -f)."""
    _git("init", "-q", "--bare", str(git_dir))
    env = {"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(tree)}
    _git("add", "-A", "-f", ".", env=env, cwd=tree)
    return _git("write-tree", env=env)


def test_every_base_has_a_series_and_a_pinned_sdist():
    assert patches.DEFAULT_BASE == sources.DEFAULT_SDIST.release and patches.DEFAULT_BASE in patches.SERIES_DIRS
    assert sorted(patches.SERIES_DIRS) == sorted(s.release for s in sources.SDISTS) == ["b11312", "b11549"]
    assert patches.series_for("b11400") is None
    for sdist in sources.SDISTS:
        base = patches.base_of(patches.SERIES_DIRS[sdist.release])
        assert base is not None and base.release == sdist.release and base.commit == sdist.commit
        assert base.source.startswith(f"{sdist.package}=={sdist.version} sdist (sha256 {sdist.sha256})")
        assert base.source.endswith(sdist.subdir) and len(base.tree) == 40
    old, new = patches.series_for("b11312"), patches.series_for("b11549")
    assert old is not None and new is not None
    # the same patches, under the same names, in every base (switches and doctor go by name); b11549's adds
    # 0009 (MiniCPM-V 4.7), which b11312's lacks
    assert [p.name for p in new] == [p.name for p in old] + ["0009-mtmd-llama-minicpm-v-4.7.patch"]
    assert [p.summary for p in new][2:8] == [p.summary for p in old][2:]
    assert [p.number for p in new] == [f"{n:04d}" for n in range(1, 10)]
    # format-patch's numbering is the series': "[PATCH n/9]"
    assert all(f"Subject: [PATCH {i}/9] " in p.text for i, p in enumerate(new, 1))
    assert patches.DEFAULT_BASE == "b11549" and patches.shipped() == new
    assert patches.series_hash(new) != patches.series_hash(old)


@pytest.mark.parametrize("sdist", BASES)
def test_the_recorded_base_is_the_pinned_sources_tree(tmp_path, sdist):
    base = patches.base_of(patches.SERIES_DIRS[sdist.release])
    assert base is not None
    tree = sources.sdist_tree(sdist)
    assert tree == sources.sdist_tree_dir(sdist) and sources.sdist_of_tree(tree) == sdist
    assert _tree_hash(tree, tmp_path / "git") == base.tree


@pytest.mark.parametrize("sdist", BASES)
def test_the_series_applies_to_its_base_and_makes_the_same_changes(tmp_path, sdist):
    series = patches.series_for(sdist.release)
    assert series is not None
    source = sources.sdist_tree(sdist)
    dest = tmp_path / "tree"
    for p in series:
        for fd in patches.parse(p):
            (dest / fd.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / fd.path, dest / fd.path)
    changed = [path for p in series for path in patches.apply(dest, p)]
    assert "tools/server/server-schema.cpp" in changed and "common/speculative.cpp" in changed
    schema = (dest / "tools/server/server-schema.cpp").read_text()
    assert '"speculative.n_max"' in schema and "#if 0\n    // TODO: for now" not in schema
    spec = (dest / "common/speculative.cpp").read_text()
    assert "common_speculative_budget_choose" in spec and "dp.n_max_for_model()" in spec
    assert "std::min<int64_t>(K, n_new)" in (dest / "src/models/delta-net-base.cpp").read_text()
    assert "--spec-cost-table" in (dest / "common/arg.cpp").read_text()
    assert "ne11 <= (stock ? 3 : MMVF_MAX_BATCH_SIZE)" in (dest / "ggml/src/ggml-cuda/mmvf.cu").read_text()
    assert "argmax_f32_split<<<" in (dest / "ggml/src/ggml-cuda/argmax.cu").read_text()
    if sdist.release == "b11549":  # upstream's sampled drafts (result_q) kept, and trimmed with the request's cap
        assert "dp.result_q->resize(n_cap);" in spec
        # 0009: the minicpmv4_7 projector and rope.section_order, each behind DSPARK_NO_MINICPMV47
        assert '{ PROJECTOR_TYPE_MINICPMV4_7,       "minicpmv4_7"},' in (dest / "tools/mtmd/clip-impl.h").read_text()
        clip = (dest / "tools/mtmd/clip.cpp").read_text()
        assert 'PROJECTOR_TYPE_MINICPMV4_7 && std::getenv("DSPARK_NO_MINICPMV47") != nullptr' in clip
        for arch in ("qwen35", "qwen35moe"):
            model = (dest / f"src/models/{arch}.cpp").read_text()
            assert 'getenv("DSPARK_NO_MINICPMV47") == nullptr && ml.get_key(LLM_KV_ROPE_SECTION_ORDER' in model


def test_the_rebased_series_is_format_patch_of_its_recorded_base(tmp_path):
    """Remake the base commit (recorded tree, message, fixed identity and date), `git am` the series onto it,
    and `git format-patch --base` gives back the shipped files byte for byte."""
    directory = patches.SERIES_DIRS["b11549"]
    base = patches.base_of(directory)
    assert base is not None and base.base_commit and base.message
    repo = tmp_path / "repo"
    shutil.copytree(sources.sdist_tree(sources.XLLAMACPP), repo, symlinks=True)
    _git("init", "-q", str(repo))
    _git("add", "-A", "-f", ".", cwd=repo)
    assert _git("write-tree", cwd=repo) == base.tree
    fixed = {**GIT_ID, "GIT_AUTHOR_DATE": "2026-10-10T00:00:00Z", "GIT_COMMITTER_DATE": "2026-10-10T00:00:00Z"}
    commit = subprocess.run(
        ["git", "commit-tree", base.tree],
        input=base.message + "\n",
        capture_output=True,
        text=True,
        cwd=repo,
        env={k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | fixed,
        check=True,
    ).stdout.strip()
    assert commit == base.base_commit
    _git("checkout", "-q", "-B", "dspark", commit, cwd=repo)
    files = sorted(directory.glob("*.patch"))
    _git("am", "-q", "--keep-cr", *map(str, files), env=GIT_ID, cwd=repo)
    out = tmp_path / "out"
    args = ["format-patch", "-q", f"--base={commit}", "--zero-commit", "--no-signature", f"{commit}..dspark"]
    _git(*args, "-o", str(out), cwd=repo)
    made = sorted(out.glob("*.patch"))
    assert len(made) == len(files)
    for mine, shipped in zip(made, files):
        assert mine.read_bytes() == shipped.read_bytes(), shipped.name
