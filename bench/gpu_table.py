"""Markdown table of one GPU run: bench/cuda_codec_benchmark's rows beside
bench/cuda_torch_reference.py's of the same run, as in docs/benchmarks.md.

    python3 bench/gpu_table.py RESULTS_DIR

RESULTS_DIR is what `tools/gpu_test run` wrote (cuda_codec_benchmark.jsonl,
cuda_torch_reference.jsonl). For each op and size: our time and fraction of
the device's copy bandwidth, PyTorch's, and PyTorch's time over ours.
"""

import json
import pathlib
import sys


def load(path: pathlib.Path) -> dict:
    rows = {}
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "op" in row:
            rows[(row["op"], row["n"])] = row
    return rows


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    results = pathlib.Path(sys.argv[1])
    ours = load(results / "cuda_codec_benchmark.jsonl")
    torch = load(results / "cuda_torch_reference.jsonl")
    if not ours:
        print(f"gpu_table: no rows in {results}/cuda_codec_benchmark.jsonl", file=sys.stderr)
        return 1
    print("| op | floats | gradcomp ms | of copy | PyTorch ms | of copy | PyTorch / gradcomp |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (op, n), row in sorted(ours.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        # PyTorch's int8/QSGD rows use whole buckets, so n may be a few
        # elements short of ours: match on the op and the nearest size.
        ref = torch.get((op, n)) or next(
            (r for (o, m), r in torch.items() if o == op and abs(m - n) < 1024), None)
        if ref:
            print(f"| {op} | {n:,} | {row['ms']:.4f} | {row['fraction_of_copy']:.2f} | "
                  f"{ref['ms']:.4f} | {ref['fraction_of_copy']:.2f} | {ref['ms'] / row['ms']:.2f}x |")
        else:
            print(f"| {op} | {n:,} | {row['ms']:.4f} | {row['fraction_of_copy']:.2f} | - | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
