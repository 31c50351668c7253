"""llama.placement: endpoints, the typed multi-device options, llama.cpp's layer split redone, the draft's device.

The layer-split figures are worked out by hand from load_tensors' rule (split points = cumulative
normalised proportions; layer il of n_layer + 1 goes to the first device whose point is above
il / (n_layer + 1)); tests/test_rpc.py checks the same function against a real llama-server's buffers.
"""

from __future__ import annotations

import pytest

from dsparkcli.errors import UsageError
from dsparkcli.llama.placement import (
    DeviceShare,
    Endpoint,
    Placement,
    device_bytes,
    layer_devices,
    output_device,
    parse_endpoints,
    parse_tensor_split,
    place_draft,
    rpc_device_names,
    split_points,
)
from dsparkcli.llama.server import ServerConfig


def test_endpoints_parse_and_fail_in_one_line():
    assert parse_endpoints("127.0.0.1:50052, 10.0.0.2:50053") == (
        Endpoint("127.0.0.1", 50052),
        Endpoint("10.0.0.2", 50053),
    )
    assert str(parse_endpoints("gpu-box.lan:1")[0]) == "gpu-box.lan:1"
    for bad in ("127.0.0.1", "host:0", "host:70000", ":5", "a b:1", ""):
        with pytest.raises(UsageError, match="is not HOST:PORT"):
            parse_endpoints(bad)
    with pytest.raises(UsageError, match="listed twice"):
        parse_endpoints("h:1,h:1")


def test_tensor_split_parses_like_llama_cpp():
    assert parse_tensor_split("3,1") == (3.0, 1.0)
    assert parse_tensor_split("1/1/2") == (1.0, 1.0, 2.0)
    for bad in ("a,b", "-1,2", "0,0", ""):
        with pytest.raises(UsageError, match="--tensor-split"):
            parse_tensor_split(bad)


def test_rpc_devices_are_numbered_across_workers():
    eps = parse_endpoints("a:1,b:2")
    assert rpc_device_names(eps) == ["RPC0", "RPC1"]
    assert rpc_device_names(eps, devices_per_worker=2) == ["RPC0", "RPC1", "RPC2", "RPC3"]


def test_argv_carries_every_typed_option_and_the_draft_device_only_with_a_draft():
    p = Placement(
        rpc=parse_endpoints("h:1,h:2"), split_mode="layer", tensor_split=(3.0, 1.0), main_gpu=0, draft_device="RPC1"
    )
    assert p.argv(drafting=True) == ["--rpc", "h:1,h:2", "-sm", "layer", "-ts", "3,1", "-mg", "0", "-devd", "RPC1"]
    assert "-devd" not in p.argv(drafting=False)
    cfg = ServerConfig(model="t.gguf", draft="d.gguf", placement=p, extra_args=("-fa", "on"))  # type: ignore[arg-type]
    argv = cfg.argv("llama-server", 8080)  # type: ignore[arg-type]
    assert argv[argv.index("--rpc") + 1] == "h:1,h:2" and argv[-2:] == ["-fa", "on"]  # passthrough last: it wins
    assert Placement().argv(drafting=True) == [] and Placement().empty


def test_validate_refuses_what_llama_cpp_would_ignore():
    with pytest.raises(UsageError, match="--split-mode must be one of layer, row"):
        Placement(split_mode="tensor").validate()
    with pytest.raises(UsageError, match="RPC workers take whole layers"):
        Placement(rpc=parse_endpoints("h:1"), split_mode="row").validate()
    Placement(split_mode="row", tensor_split=(1.0, 1.0)).validate()  # row is fine on one machine's GPUs


def test_split_points_and_layer_devices_by_hand():
    assert split_points((3, 1)) == [0.75, 1.0]
    # 4 repeating layers + output = 5 slots; points 0.5 / 1.0: il/5 = 0, .2, .4 -> dev 0; .6, .8 -> dev 1
    assert layer_devices(4, (1, 1)) == [0, 0, 0, 1, 1]
    # 3,1 over 40 layers (MiniCPM-V 4.7's target): 41 slots, the first with il/41 >= 0.75 is il 31
    devs = layer_devices(40, (3, 1))
    assert devs.index(1) == 31 and devs.count(0) == 31 and devs.count(1) == 10
    # a zero share takes nothing: 1,0,1 over 4 layers -> points .5, .5, 1
    assert layer_devices(4, (1, 0, 1)) == [0, 0, 0, 2, 2]
    # -ngl 2 of 5 slots: the first three stay on the host, the last two split 1:1
    assert layer_devices(4, (1, 1), n_gpu_layers=2) == [None, None, None, 0, 1]


def test_device_bytes_adds_weights_and_kv_per_layer():
    shares = device_bytes(
        [100, 100, 100, 100],
        input_bytes=7,
        output_bytes=50,
        kv_per_layer=[10, 10, 10, 10],
        fractions=(1, 1),
        names=["RPC0", "RPC1"],
    )
    assert shares == (
        DeviceShare("host", 7, 0, ()),
        DeviceShare("RPC0", 300, 30, (0, 1, 2)),
        DeviceShare("RPC1", 150, 10, (3, 4)),  # layer 3 and the output layer (index 4)
    )
    assert sum(s.total_bytes for s in shares) == 7 + 400 + 50 + 40


def test_the_output_layer_holder_is_the_last_device_with_a_share():
    two = Placement(rpc=parse_endpoints("h:1,h:2"))
    assert output_device(two, []) == "RPC1"
    assert output_device(two, ["CUDA0"]) == "CUDA0"  # llama.cpp puts workers first, local GPUs after
    assert output_device(Placement(rpc=two.rpc, tensor_split=(1, 0, 0)), ["CUDA0"]) == "RPC0"
    assert output_device(Placement(rpc=two.rpc, devices="CUDA0,RPC0"), []) == "RPC0"
    assert output_device(Placement(), []) is None


def test_the_draft_goes_where_the_pinned_engine_can_run_it():
    two = Placement(rpc=parse_endpoints("h:1,h:2"))
    assert place_draft(two, [], draft_has_lm_head=False).draft_device == "RPC1"
    assert place_draft(Placement(rpc=two.rpc, draft_device="RPC1"), [], draft_has_lm_head=False).draft_device == "RPC1"
    with pytest.raises(UsageError, match="borrows the target's output layer.*RPC1 here"):
        place_draft(Placement(rpc=two.rpc, draft_device="none"), [], draft_has_lm_head=False)
    # a draft with its own lm head, or no workers at all: the user's choice (or llama.cpp's default) stands
    assert place_draft(Placement(rpc=two.rpc, draft_device="none"), [], draft_has_lm_head=True).draft_device == "none"
    assert place_draft(Placement(draft_device="CUDA1"), ["CUDA0", "CUDA1"], draft_has_lm_head=False) == Placement(
        draft_device="CUDA1"
    )
