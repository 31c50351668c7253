"""What a tuning is valid for, pure: the exact files, the engine build, the machine and the llama-server
settings that change what a token or a step costs. ``budget.store.key_for`` builds it from a server's
configuration (the one place: tune, run, serve and bench all go through it).

Not in the key: the context size (``-c``). llama.cpp attends over the KV cells in use (padded to 256),
not over the allocated context, so ``-c 4096`` and the model's default decode a prompt at the same speed;
with it in the key, `dspark tune` (no -c) and `dspark bench` (-c 4096 by default) found no common tuning.

Standard library only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# llama-server flags that change what a token or a step costs (value as given), by their canonical names
SPEED_FLAGS: dict[str, str] = {
    "-ngl": "ngl",
    "--gpu-layers": "ngl",
    "--n-gpu-layers": "ngl",
    "-ngld": "ngld",
    "--gpu-layers-draft": "ngld",
    "--n-gpu-layers-draft": "ngld",
    "-fa": "fa",
    "--flash-attn": "fa",
    "-ctk": "ctk",
    "--cache-type-k": "ctk",
    "-ctv": "ctv",
    "--cache-type-v": "ctv",
    "-ctkd": "ctkd",
    "--cache-type-k-draft": "ctkd",
    "-ctvd": "ctvd",
    "--cache-type-v-draft": "ctvd",
    "-np": "np",
    "--parallel": "np",
    "-t": "threads",
    "--threads": "threads",
    "-td": "threads_draft",
    "--threads-draft": "threads_draft",
    "-b": "batch",
    "--batch-size": "batch",
    "-ub": "ubatch",
    "--ubatch-size": "ubatch",
    "--rpc": "rpc",
    "-sm": "split_mode",
    "--split-mode": "split_mode",
    "-ts": "tensor_split",
    "--tensor-split": "tensor_split",
    "-mg": "main_gpu",
    "--main-gpu": "main_gpu",
    "-dev": "device",
    "--device": "device",
    "-devd": "device_draft",
    "--device-draft": "device_draft",
}
# the flags' names in messages: the CLI option a user gives (dspark's own where it has one)
FLAG_NAMES = {
    "threads": "--threads",
    "np": "--parallel",
    "ngl": "-ngl",
    "ngld": "-ngld",
    "fa": "-fa",
    "rpc": "--rpc",
    "split_mode": "--split-mode",
    "tensor_split": "--tensor-split",
    "main_gpu": "--main-gpu",
    "device_draft": "--draft-device",
}


def speed_flags(argv: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The speed-changing flags of a llama-server argv, canonical names, sorted; the last value wins."""
    found: dict[str, str] = {}
    args = list(argv)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in SPEED_FLAGS:
            if eq:
                found[SPEED_FLAGS[name]] = value
            elif i + 1 < len(args):
                found[SPEED_FLAGS[name]] = args[i + 1]
    return tuple(sorted(found.items()))


@dataclass(frozen=True)
class TuningKey:
    """What a tuning is valid for: the exact files, engine build, machine and speed-changing flags."""

    target_sha256: str
    draft_sha256: str
    engine_commit: str
    backend: str
    gpu: str
    flags: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        """A short stable name (the record's file name)."""
        text = json.dumps(self.to_record(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_record(self) -> dict[str, Any]:
        return {
            "target_sha256": self.target_sha256,
            "draft_sha256": self.draft_sha256,
            "engine_commit": self.engine_commit,
            "backend": self.backend,
            "gpu": self.gpu,
            "flags": {k: v for k, v in self.flags},
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> TuningKey:
        return cls(
            target_sha256=str(rec["target_sha256"]),
            draft_sha256=str(rec["draft_sha256"]),
            engine_commit=str(rec["engine_commit"]),
            backend=str(rec["backend"]),
            gpu=str(rec["gpu"]),
            flags=tuple(sorted((str(k), str(v)) for k, v in (rec.get("flags") or {}).items())),
        )

    def same_pair(self, other: TuningKey) -> bool:
        return (self.target_sha256, self.draft_sha256) == (other.target_sha256, other.draft_sha256)

    def differences(self, other: TuningKey) -> list[str]:
        """What differs in ``other`` (a stored tuning's key) from this one, for "no tuning matches" messages:
        "threads 1 (here default)" names the setting, the tuning's value, and this server's."""
        out = [
            name
            for name, a, b in (
                ("target", self.target_sha256, other.target_sha256),
                ("draft", self.draft_sha256, other.draft_sha256),
                ("engine commit", self.engine_commit, other.engine_commit),
                ("backend", self.backend, other.backend),
                ("GPU", self.gpu, other.gpu),
            )
            if a != b
        ]
        mine, theirs = dict(self.flags), dict(other.flags)
        for flag in sorted(set(mine) | set(theirs)):
            if mine.get(flag) != theirs.get(flag):
                out.append(
                    f"{FLAG_NAMES.get(flag, flag)} {theirs.get(flag, 'default')} (here {mine.get(flag, 'default')})"
                )
        return out
