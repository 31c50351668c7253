#!/usr/bin/env python3
"""Write a llama-quantize --tensor-type-file that pins every tensor of a GGUF to its current type.

The heads (markov_w1, markov_w2, fc) go to --heads, --tensor NAME=TYPE overrides on top. Lines are
anchored, escaped regexes (``^fc\\.weight$=q8_0``): llama-quantize regex_search-es each pattern and takes
the first match. Use the map with a *quantised* positional type (e.g. Q8_0): positional COPY, F32, F16
and BF16 ignore the map. `dspark requant` does all of this and verifies the result.

    python -m study.gguf_tensor_type_map draft.gguf > types.txt
    python -m study.gguf_tensor_type_map draft.gguf --heads q6_K --tensor fc.weight=q8_0 -o types.txt
    llama-quantize --tensor-type-file types.txt draft.gguf draft-q8heads.gguf Q8_0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dsparkcli import requant
from dsparkcli.errors import DsparkError
from dsparkcli.gguf import reader


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[1],
        epilog=__doc__[__doc__.index("    python") :],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("gguf", type=Path, help="input GGUF")
    ap.add_argument("--heads", default="q8_0", help="type for markov_w1, markov_w2, fc (q8_0, q6_K, bf16)")
    ap.add_argument("--tensor", action="append", default=[], metavar="NAME=TYPE", help="override, repeatable")
    ap.add_argument("--allow-requantize", action="store_true", help="allow changing already-quantised tensors")
    ap.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    args = ap.parse_args(argv)
    try:
        header = reader.read_header(args.gguf)
        tensors = requant.plan_tensors(
            header, heads=args.heads, overrides=args.tensor, allow_requantize=args.allow_requantize
        )
    except DsparkError as e:
        print(f"gguf_tensor_type_map: error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        print(f"gguf_tensor_type_map: error: {e.strerror}: {e.filename}", file=sys.stderr)
        return 2
    lines = requant.type_map_lines(tensors)
    changes = sum(t.changes for t in tensors)
    text = "\n".join(lines) + "\n"
    if args.output:
        args.output.write_text(text)
        print(f"{len(lines)} lines, {changes} change(s): {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
