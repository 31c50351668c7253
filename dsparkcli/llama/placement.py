"""Where llama.cpp puts a model: RPC workers, the multi-GPU split, the draft's device. Pure, stdlib only.

``Placement`` is what run, serve, bench (and tune) pass to llama-server as typed options instead of
``--`` passthrough: ``--rpc``, ``-sm``, ``-ts``, ``-mg``, ``-dev``, ``-devd``. ``layer_devices`` and
``device_bytes`` redo llama.cpp's layer split (``src/llama-model.cpp``, load_tensors: the split points
are the cumulative normalised ``--tensor-split``; layer ``il`` goes to the first device whose split
point is above ``il / (n_layer + 1)``; the input embedding stays on the host; the output layer counts
as layer ``n_layer``), so ``dspark inspect -c`` can say how many bytes land on each device.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dsparkcli.errors import UsageError

SPLIT_MODES = ("layer", "row")
HOST = "host"  # the name device_bytes gives the llama-server machine's own memory (input embedding)
DRAFT_LOCAL = "none"  # -devd none: the draft is not offloaded, it runs in the llama-server process


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Endpoint:
    """One rpc-server worker, ``HOST:PORT``."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


_ENDPOINT_RE = re.compile(r"^(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})$")


def parse_endpoints(text: str) -> tuple[Endpoint, ...]:
    """``"127.0.0.1:50052,10.0.0.2:50052"`` -> endpoints; a bad one fails in one line that names it."""
    found: list[Endpoint] = []
    for raw in text.split(","):
        item = raw.strip()
        m = _ENDPOINT_RE.match(item)
        port = int(m.group("port")) if m else 0
        if not m or not 1 <= port <= 65535:
            raise UsageError(f"--rpc: '{item}' is not HOST:PORT (e.g. 127.0.0.1:50052)")
        ep = Endpoint(m.group("host"), port)
        if ep in found:
            raise UsageError(f"--rpc: {ep} is listed twice")
        found.append(ep)
    return tuple(found)


def parse_tensor_split(text: str) -> tuple[float, ...]:
    """``"3,1"`` -> (3.0, 1.0): proportions per device, as llama.cpp's ``-ts`` (``,`` or ``/``)."""
    try:
        parts = tuple(float(x) for x in re.split(r"[,/]+", text.strip()) if x != "")
    except ValueError:
        raise UsageError(f"--tensor-split: '{text}' is not a list of numbers (e.g. 3,1)") from None
    if not parts or any(p < 0 for p in parts) or sum(parts) <= 0:
        raise UsageError(f"--tensor-split: '{text}' needs non-negative proportions, at least one above 0")
    return parts


def rpc_device_names(endpoints: Sequence[Endpoint], devices_per_worker: int = 1) -> list[str]:
    """llama.cpp's names for the workers' devices: ``RPC0``, ``RPC1``, ... numbered across workers in
    ``--rpc`` order (ggml-rpc.cpp, ggml_backend_rpc_add_server)."""
    return [f"RPC{i}" for i in range(len(endpoints) * devices_per_worker)]


@dataclass(frozen=True)
class Placement:
    """Typed multi-device options. Empty means llama.cpp's defaults (one machine, its devices)."""

    rpc: tuple[Endpoint, ...] = ()
    split_mode: str | None = None  # -sm layer|row
    tensor_split: tuple[float, ...] = ()  # -ts
    main_gpu: int | None = None  # -mg
    devices: str | None = None  # -dev: the target's devices (names, comma-separated)
    draft_device: str | None = None  # -devd: the draft's devices, "none" = not offloaded

    def validate(self) -> None:
        if self.split_mode is not None and self.split_mode not in SPLIT_MODES:
            raise UsageError(f"--split-mode must be one of {', '.join(SPLIT_MODES)} (got {self.split_mode})")
        if self.split_mode == "row" and self.rpc:
            # ggml-rpc has no split buffer type: llama.cpp would silently fall back to whole layers per worker
            raise UsageError(
                "--split-mode row splits weight rows across one backend's GPUs (CUDA); "
                "RPC workers take whole layers: use --split-mode layer with --rpc"
            )
        if self.main_gpu is not None and self.main_gpu < 0:
            raise UsageError(f"--main-gpu must be >= 0 (got {self.main_gpu})")
        if self.tensor_split and (any(p < 0 for p in self.tensor_split) or sum(self.tensor_split) <= 0):
            raise UsageError("--tensor-split needs non-negative proportions, at least one above 0")

    @property
    def empty(self) -> bool:
        return self == Placement()

    def argv(self, *, drafting: bool) -> list[str]:
        args: list[str] = []
        if self.rpc:
            args += ["--rpc", ",".join(str(e) for e in self.rpc)]
        if self.devices:
            args += ["-dev", self.devices]
        if self.split_mode:
            args += ["-sm", self.split_mode]
        if self.tensor_split:
            args += ["-ts", ",".join(f"{p:g}" for p in self.tensor_split)]
        if self.main_gpu is not None:
            args += ["-mg", str(self.main_gpu)]
        if drafting and self.draft_device:
            args += ["-devd", self.draft_device]
        return args


# ------------------------------------------------------------------ llama.cpp's layer split, redone


def split_points(fractions: Sequence[float]) -> list[float]:
    """Cumulative, normalised proportions: llama.cpp's ``splits`` vector."""
    total = float(sum(fractions))
    if total <= 0:
        raise UsageError("a split needs at least one proportion above 0")
    points, acc = [], 0.0
    for f in fractions:
        acc += f
        points.append(acc / total)
    return points


def layer_devices(n_layer: int, fractions: Sequence[float], n_gpu_layers: int | None = None) -> list[int | None]:
    """Device index of each of the ``n_layer + 1`` layers (the last is the output layer); None = host.

    ``n_gpu_layers`` as ``-ngl`` (None: all). Mirrors ``get_layer_buft_list`` in load_tensors, float32
    comparison aside (it only matters exactly on a split point, where both pick the next device).
    """
    points = split_points(fractions)
    n_all = n_layer + 1
    ngl = n_all if n_gpu_layers is None or n_gpu_layers < 0 else n_gpu_layers
    start = max(n_all - ngl, 0)
    active = min(ngl, n_all)
    out: list[int | None] = []
    for il in range(n_all):
        if il < start or il - start >= active:
            out.append(None)
            continue
        x = (il - start) / active
        out.append(min(next((i for i, p in enumerate(points) if p > x), len(points) - 1), len(points) - 1))
    return out


@dataclass(frozen=True)
class DeviceShare:
    device: str  # "host", or the device's name/index
    weights_bytes: int
    kv_bytes: int
    layers: tuple[int, ...]  # repeating layers on it (n_layer = the output layer)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes


def device_bytes(
    layer_weights: Sequence[int],
    input_bytes: int,
    output_bytes: int,
    kv_per_layer: Sequence[int],
    fractions: Sequence[float],
    *,
    names: Sequence[str] | None = None,
    n_gpu_layers: int | None = None,
) -> tuple[DeviceShare, ...]:
    """Bytes of weights and KV cache on each device for a layer split (``kv_per_layer`` already times ctx).

    The host row holds the input embedding and any layer not offloaded (``n_gpu_layers``); a layer's KV
    cache sits with its weights (llama.cpp's default, offload_kqv on).
    """
    n_layer = len(layer_weights)
    if len(kv_per_layer) != n_layer:
        raise ValueError("one KV figure per layer")
    names = list(names) if names is not None else [str(i) for i in range(len(fractions))]
    if len(names) != len(fractions):
        raise ValueError("one name per device")
    assign = layer_devices(n_layer, fractions, n_gpu_layers)
    weights = {n: 0 for n in [HOST, *names]}
    kv = dict.fromkeys(weights, 0)
    layers: dict[str, list[int]] = {n: [] for n in weights}
    weights[HOST] += input_bytes
    for il, dev in enumerate(assign):
        name = HOST if dev is None else names[dev]
        if il < n_layer:
            weights[name] += layer_weights[il]
            kv[name] += kv_per_layer[il]
        else:
            weights[name] += output_bytes
        layers[name].append(il)
    return tuple(DeviceShare(n, weights[n], kv[n], tuple(layers[n])) for n in weights)


# ------------------------------------------------------------------ where the DSpark draft can run

# Why the draft's device is not free with --rpc (pinned engine 0c1e570): a DSpark draft without its own
# lm head borrows the target's (src/models/dflash.cpp, "lm_head from the target model (shared via
# ctx_other)"), and ggml's scheduler runs an op on the backend that owns its weight's buffer. A draft
# whose layers sit on another device then aborts llama-server at its first graph: "pre-allocated tensor
# (output.weight) in a buffer (RPC1[...]) that cannot run the operation" (ggml-backend.cpp:941). Seen
# here with -devd none (draft in the llama-server process, target's output layer on a worker) and with
# -devd on the other worker. The draft works on the device that holds the target's output layer.
DRAFT_DEVICE_WHY = (
    "the DSpark draft borrows the target's output layer (lm_head), and llama.cpp 0c1e570 aborts "
    "when the draft runs on a device other than the one holding it"
)


def model_devices(placement: Placement, local_devices: Sequence[str]) -> list[str]:
    """The target's devices in llama.cpp's order: ``-dev`` when given, else the workers (first, to keep
    traffic low: llama.cpp's llama_prepare_model_devices) then this machine's GPUs."""
    if placement.devices:
        return [d.strip() for d in placement.devices.split(",") if d.strip()]
    return [*rpc_device_names(placement.rpc), *local_devices]


def output_device(placement: Placement, local_devices: Sequence[str]) -> str | None:
    """The device that gets the target's output layer: the last device with a share of the split (the
    default split, by free memory, gives every device one). None: no devices, the host holds it."""
    devices = model_devices(placement, local_devices)
    if not devices:
        return None
    shares = list(placement.tensor_split[: len(devices)]) or [1.0] * len(devices)
    shares += [0.0] * (len(devices) - len(shares))
    if not any(shares):  # llama.cpp treats an all-zero split as "by free memory"
        shares = [1.0] * len(devices)
    return devices[max(i for i, s in enumerate(shares) if s > 0)]


def place_draft(placement: Placement, local_devices: Sequence[str], *, draft_has_lm_head: bool) -> Placement:
    """With RPC workers, the draft goes on the device that holds the target's output layer (one device:
    the draft's few layers then cost no network hops between them). A ``--draft-device`` elsewhere is
    refused up front with the reason; a draft with its own lm head may go anywhere."""
    if not placement.rpc or draft_has_lm_head:
        return placement
    holder = output_device(placement, local_devices)
    if holder is None:
        return placement
    if placement.draft_device is None:
        return replace(placement, draft_device=holder)
    if placement.draft_device != holder:
        raise UsageError(
            f"--draft-device {placement.draft_device}: {DRAFT_DEVICE_WHY}, {holder} here "
            f"(the last device of the split); leave --draft-device out or give {holder}"
        )
    return placement


def describe(placement: Placement, local_devices: Sequence[str] = ()) -> str:
    """One line for the user: where the target and the draft went."""
    if not placement.rpc and placement.empty:
        return ""
    devices = model_devices(placement, local_devices)
    names = {n: str(e) for n, e in zip(rpc_device_names(placement.rpc), placement.rpc)}
    target = ", ".join(f"{d} ({names[d]})" if d in names else d for d in devices)
    split = f" split {','.join(f'{p:g}' for p in placement.tensor_split)}" if placement.tensor_split else ""
    draft = f"; draft on {placement.draft_device}" if placement.draft_device else ""
    return f"target on {target}{split}{draft}"
