"""`dspark doctor`: which llama.cpp, its version, devices and DSpark capabilities."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer
from rich.table import Table

from dsparkcli import doctor as core
from dsparkcli import selftest
from dsparkcli.cli._common import JsonOpt, LlamaBinOpt
from dsparkcli.cli._output import out, print_json
from dsparkcli.errors import EngineCapabilityError
from dsparkcli.llama.engine import BUILD_HINT

HELP = """Show the llama.cpp engine dspark uses and what it can do and load.

What it loads (model archs, vision projector types, ggml tensor types) comes from the source
tree of an engine dspark built (exact), or else from the strings of the binary's shared
libraries (a name absent there is surely unknown to it); fetch, run, serve, bench and inspect
check files against it.

\b
Examples:
  dspark doctor
  dspark doctor --json
  dspark doctor --selftest      # serve a synthetic pair, compare with the exact prediction
  dspark doctor --llama-bin ~/llama.cpp/build/bin/llama-server
"""


def _check_line(check: selftest.SelftestCheck) -> str:
    verdict = "PASS" if check.ok else "FAIL"
    output = "" if check.name.startswith("/metrics") else f", output {'matches' if check.tokens_match else 'DIFFERS'}"
    return (
        f"{verdict}  {check.name} (n_max {check.n_max}, p_min {check.p_min:g}): "
        f"draft_n {check.observed_draft_n} (predicted {check.expected_draft_n}), "
        f"accepted {check.observed_accepted} (predicted {check.expected_accepted}){output}"
        + (f" -- {check.detail}" if check.detail else "")
    )


def _selftest(report: core.DoctorReport, llama_bin: str | None, json_out: bool) -> None:
    """Run the known-answer selftest; print each check, then PASS or FAIL. FAIL exits non-zero."""
    if not json_out:
        out.print("selftest: serving a synthetic known-answer pair with draft-dspark ...")
    result = selftest.run_selftest(llama_bin, on_check=None if json_out else (lambda c: out.print(_check_line(c))))
    n_bad = sum(not c.ok for c in result.checks)
    if json_out:
        print_json({**dataclasses.asdict(report), "selftest": result})
    elif result.ok:
        out.print(
            f"selftest PASS: {len(result.checks)} of {len(result.checks)} checks match the prediction "
            f"({result.seconds:.1f} s)"
        )
    else:
        out.print(
            f"selftest FAIL: {n_bad} of {len(result.checks)} checks differ from the prediction "
            f"({result.seconds:.1f} s); server logs: {', '.join(result.log_paths)}"
        )
    if not result.ok:
        raise EngineCapabilityError(
            f"DSpark selftest failed: {n_bad} of {len(result.checks)} checks differ from "
            f"the prediction with {report.server}"
        )


def doctor(
    llama_bin: LlamaBinOpt = None,
    json_out: JsonOpt = False,
    run_selftest: Annotated[
        bool,
        typer.Option(
            "--selftest",
            help="Serve a synthetic pair with draft-dspark; check tokens and draft counters against "
            "the exact prediction (seconds, no download).",
        ),
    ] = False,
) -> None:
    report = core.diagnose(llama_bin)
    combined_json = json_out and run_selftest and report.ok  # one document with the selftest in it, printed later
    if json_out:
        if not combined_json:
            print_json(report)
    else:
        table = Table(show_header=False, box=None)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        table.add_row("llama-server", report.server)
        table.add_row("found via", report.found_via)
        table.add_row("version", f"{report.version or '?'} (commit {report.commit or '?'})")
        table.add_row("upstream", core.upstream_line(report))
        table.add_row("backend", report.backend)
        table.add_row("devices", "\n".join(report.devices) or "CPU only")
        caps = report.capabilities
        yes = {True: "yes", False: "NO"}
        table.add_row("draft-dspark", yes[caps.draft_dspark])
        table.add_row("--mmproj", yes[caps.mmproj])
        table.add_row("--spec-synth-len", yes[caps.spec_synth_len])
        table.add_row("--spec-draft-p-min", yes[caps.spec_draft_p_min])
        table.add_row("dspark patches", core.patch_line(report))
        table.add_row("per-request drafts", yes[caps.request_draft_params] + " (speculative.n_max, n_min, p_min)")
        table.add_row("--budget adaptive", yes[caps.adaptive_budget] + " (--spec-draft-n-max auto, --spec-cost-table)")
        if report.loads is not None:
            t = report.loads
            origin = "the source tree" if t.origin == "source" else "the strings of its shared libraries"
            table.add_row(
                "loads",
                f"{len(t.archs)} archs, {len(t.projectors)} projector types, "
                f"{len(t.tensor_types)} tensor types (from {origin} {t.where}; --json lists them)",
            )
        table.add_row("server logs", f"{report.log_dir} (one per launch, the newest {report.logs_kept} kept)")
        out.print(table)
        for problem in report.problems:
            out.print(f"warning: {problem}")
    if not report.ok:
        raise EngineCapabilityError(f"{report.server} cannot run DSpark drafts (no draft-dspark)", hint=BUILD_HINT)
    if run_selftest:
        _selftest(report, llama_bin, json_out)


def register(app: typer.Typer) -> None:
    app.command("doctor", help=HELP)(doctor)
