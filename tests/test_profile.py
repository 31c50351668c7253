"""study.kernel_profile: ncu's CSV -> kernel records -> "where a step's milliseconds go" (issue 19).

The fixture is written here in ncu's documented --csv layout (details page: one row per kernel x metric)."""

from __future__ import annotations

import csv
import io

import pytest

from support.scripts import script

profile = script("kernel_profile")

HEADER = [
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
    "Section Name",
    "Metric Name",
    "Metric Unit",
    "Metric Value",
]
MMVQ = "void mul_mat_vec_q<(ggml_type)12, 1, false>(const void *, const void *, const int *, float *, int)"
NORM = "void rms_norm_f32<1024, true, false>(const float *, float *, int, long, long, long, float)"
FATTN = "void flash_attn_ext_f16<128, 128, 4, 2, false, false>(const char *, const char *, float *)"


def _csv(kernels: list[tuple[str, str, str]]) -> str:
    """ncu's stdout with --csv --print-units base: its ==PROF== lines, then the table (2 metrics per kernel)."""
    buf = io.StringIO()
    buf.write("==PROF== Connected to process 4242 (/opt/llama/llama-server)\n")
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(HEADER)
    for i, (name, unit, value) in enumerate(kernels):
        common = [str(i), "4242", "llama-server", "127.0.0.1", name, "1", "7", "(256, 1, 1)", "(64, 1, 1)", "0", "9.0"]
        w.writerow([*common, "Command line profiler metrics", "launch__grid_size", "", "64"])
        w.writerow([*common, "Command line profiler metrics", "gpu__time_duration.sum", unit, value])
    buf.write("==PROF== Disconnected from process 4242\n")
    return buf.getvalue()


# two whole steps of 3 kernels, then the first kernel of a third step (cut off: not a whole step)
WINDOW = [
    (MMVQ, "nsecond", "10,000"),
    (NORM, "nsecond", "1000"),
    (FATTN, "usecond", "3"),
    (MMVQ, "nsecond", "12,000"),
    (NORM, "nsecond", "1,000"),
    (FATTN, "nsecond", "5000"),
    (MMVQ, "nsecond", "99999"),
]


def test_parse_keeps_the_time_metric_per_id_in_base_units():
    kernels = profile.parse_ncu_csv(_csv(WINDOW))
    assert [(k.id, k.ns) for k in kernels] == [
        (0, 10000.0),
        (1, 1000.0),
        (2, 3000.0),
        (3, 12000.0),
        (4, 1000.0),
        (5, 5000.0),
        (6, 99999.0),
    ]
    assert [k.kind for k in kernels] == ["matmul", "norm", "flash_attn"] * 2 + ["matmul"]
    assert kernels[0].to_record() == {"id": 0, "name": MMVQ, "kind": "matmul", "ns": 10000.0}


def test_parse_refuses_what_is_not_an_ncu_table():
    with pytest.raises(ValueError, match="no ncu CSV header"):
        profile.parse_ncu_csv("==PROF== Connected\nhello\n")
    with pytest.raises(ValueError, match="unknown time unit 'cycle'"):
        profile.parse_ncu_csv(_csv([(MMVQ, "cycle", "10")]))


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (MMVQ, "matmul"),
        ("void mul_mat_q<(ggml_type)12, 64, false>(const char *, const int *, float *, int)", "matmul"),
        ("void quantize_mmq_q8_1<(mmq_q8_1_ds_layout)1>(const float *, void *, long)", "matmul"),
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT", "matmul"),
        ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_f16_s161616gemm_f16_16x16_64x1_tn_align8>(Params)", "matmul"),
        ("void mm_ids_helper<8>(const int *, int *, int *, int)", "moe"),
        ("void topk_moe_cuda<8, true>(const float *, float *, int *, int)", "moe"),
        ("void mul_mat_vec_q_moe<(ggml_type)12, 2, true>(const void *, const void *, const int *, float *)", "matmul"),
        ("moe_weighted_reduction_f32(const float *, const float *, float *, int, int)", "moe"),
        ("void k_copy_src1_to_contiguous(const char *, char *, const int *)", "moe"),
        (FATTN, "flash_attn"),
        ("void flash_attn_combine_results<128>(const float *, const float2 *, float *, int)", "flash_attn"),
        (NORM, "norm"),
        ("void soft_max_f32<true, 0, 0>(const float *, const float *, float *, soft_max_params)", "norm"),
        ("void rope_neox<false, false, float>(const float *, float *, int)", "rope"),
        ("void k_bin_bcast<&op_add, float, float, float>(const float *, const float *, float *)", "elementwise"),
        ("void unary_gated_op_kernel<&op_silu, float>(const float *, const float *, float *)", "elementwise"),
        ("void k_get_rows_float<float, float>(const float *, const int *, float *)", "copy"),
        ("void cpy_flt<&cpy_1_flt<float, __half>>(const char *, char *, int)", "copy"),
        ("void concat_f32_dim0(const float *, const float *, float *, int)", "copy"),
        ("void argmax_f32(const float *, int *, long)", "sampling"),
        ("void ssm_conv_f32<128, 4>(const float *, const float *, float *)", "recurrent"),
        ("void gated_delta_net_cuda<128>(const float *, float *)", "recurrent"),
        ("void some_unknown_kernel(int)", "other"),
    ],
)
def test_classify(name, kind):
    assert profile.classify(name) == kind


def test_find_period():
    assert profile.find_period(list("ABCABCA")) == 3
    assert profile.find_period(list("AAAA")) == 1
    assert profile.find_period(list("ABCACB")) is None  # not periodic
    assert profile.find_period(list("ABC")) is None  # not two whole periods
    assert profile.find_period(list("ABCABDABC"), min_match=0.66) == 3  # one odd launch: 2 of 6 pairs differ
    assert profile.find_period(list("ABCABDABC"), min_match=0.8) is None
    # 8 layers of the same 2 kernels between an embedding lookup and a head: the step's period, not the layer's
    step = ["embed"] + ["attn", "ffn"] * 8 + ["norm", "head"]
    assert profile.find_period(step * 4) == 19
    odd = step * 4
    odd[40] = "cpy"  # one step launches one other kernel: no exact period; the layer's (2) fails 0.9
    assert profile.find_period(odd) is None and profile.find_period(odd, min_match=0.9) == 19


def test_step_profile_and_the_breakdown_row():
    prof = profile.step_profile(profile.parse_ncu_csv(_csv(WINDOW)))
    assert (prof.kernels, prof.period, prof.steps) == (7, 3, 2.0)
    assert prof.total_ms == pytest.approx(0.032, rel=1e-12)  # the 7th launch is not a whole step: left out
    assert prof.kernel_ms_per_step == pytest.approx(0.016, rel=1e-12)
    assert prof.by_kind_ms == pytest.approx(
        {**dict.fromkeys(profile.KINDS, 0.0), "matmul": 0.011, "norm": 0.001, "flash_attn": 0.004}, rel=1e-12
    )
    server = profile.server_step(
        {
            "predicted_n": 32,
            "predicted_ms": 40.0,
            "prompt_n": 8,
            "prompt_ms": 2.5,
            "draft_n": 21,
            "draft_n_accepted": 24 - 0,
        },
        spec_steps=8,
    )
    assert server == {
        "prompt_n": 8,
        "prompt_ms": 2.5,
        "predicted_n": 32,
        "predicted_ms": 40.0,
        "draft_n": 21,
        "draft_n_accepted": 24,
        "steps": 8,
        "t_step_ms": 5.0,
        "tokens_per_step": 4.0,
        "ms_per_token": 1.25,
    }
    row = profile.breakdown_row("k3", server, prof)
    assert row["gap_ms"] == pytest.approx(5.0 - 0.016, rel=1e-12)
    assert row["ms_per_token"] == 1.25 and row["kernel_ms_per_token"] == pytest.approx(0.004, rel=1e-12)
    assert row["kernels_per_step"] == 3
    # plain decoding: no verification steps, one token per step
    assert profile.server_step({"predicted_n": 32, "predicted_ms": 48.0}, spec_steps=0)["t_step_ms"] == 1.5


def test_a_window_that_is_not_periodic_is_never_divided():
    names = [MMVQ, NORM, FATTN, MMVQ, FATTN, NORM]
    prof = profile.step_profile(profile.parse_ncu_csv(_csv([(n, "nsecond", "1000") for n in names])))
    assert (prof.period, prof.steps, prof.kernel_ms_per_step) == (None, None, None)
    assert prof.total_ms == pytest.approx(0.006, rel=1e-12)
    row = profile.breakdown_row("plain", {"t_step_ms": 4.4, "tokens_per_step": 1.0}, prof)
    assert (row["kernel_ms"], row["gap_ms"], row["by_kind_ms"]) == (None, None, None)


def test_rows_from_records_pairs_timing_and_kernels_by_config():
    kernels = profile.parse_ncu_csv(_csv(WINDOW))
    rec = profile.kernels_record(kernels)
    assert rec["names"] == [MMVQ, NORM, FATTN] and rec["kinds"] == ["matmul", "norm", "flash_attn"]
    assert rec["kernels"][:4] == [[0, 0, 10000.0], [1, 1, 1000.0], [2, 2, 3000.0], [3, 0, 12000.0]]
    assert profile.kernels_from_record(rec) == kernels
    records = [
        {"record": "timing", "config": "plain", "t_step_ms": 5.0, "tokens_per_step": 1.0},
        {"record": "timing", "config": "plain", "t_step_ms": 3.0, "tokens_per_step": 1.0},
        {"record": "timing", "config": "plain", "t_step_ms": 4.0, "tokens_per_step": 1.0},
        {"record": "error", "config": "k1", "error": "x"},
        {"record": "kernels", "config": "plain", **rec},
        {"record": "timing", "config": "k3", "t_step_ms": 9.0, "tokens_per_step": 3.0},
    ]
    rows = profile.rows_from_records(records)
    assert [r["config"] for r in rows] == ["plain", "k3"]
    assert rows[0]["t_step_ms"] == 4.0  # the median of the 3 timed requests
    assert rows[0]["gap_ms"] == pytest.approx(4.0 - 0.016, rel=1e-12) and rows[1]["kernel_ms"] is None
    assert rows[1]["ms_per_token"] == 3.0


def test_a_step_that_differs_in_one_launch_needs_min_match():
    """Steps whose launches differ a little (the hybrid target's rollback after an accepted draft) are read
    as periodic only when asked, and the table says so."""
    odd = "void k_get_rows_float<float, float>(const float *, const int *, float *)"
    names = [MMVQ, NORM, FATTN] * 3 + [MMVQ, NORM, odd] + [MMVQ, NORM, FATTN] * 2  # 6 steps, one odd launch
    rec = profile.kernels_record(profile.parse_ncu_csv(_csv([(n, "nsecond", "1000") for n in names])))
    records = [
        {"record": "timing", "config": "k3", "t_step_ms": 1.0, "tokens_per_step": 2.0},
        {"record": "kernels", "config": "k3", **rec},
    ]
    assert profile.rows_from_records(records)[0]["kernel_ms"] is None
    assert profile.rows_from_records(records, min_match=0.9)[0]["kernel_ms"] is None  # 13/15 match < 0.9
    row = profile.rows_from_records(records, min_match=0.85)[0]  # 2 of 15 pairs one step apart differ
    assert (row["kernels_per_step"], row["kernel_ms"]) == (3, pytest.approx(0.003, rel=1e-12))
    assert row["by_kind_ms"]["copy"] == pytest.approx(0.001 / 6, rel=1e-12)
    md = script("profile_to_md").table(records, min_match=0.85)
    assert "| k3 | 1.000 | 2.00 | – | 0.003 |" in md and "read with 0.85 of consecutive" in md
    assert "Not periodic" in script("profile_to_md").table(records)
