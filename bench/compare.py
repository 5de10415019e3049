"""Turns codec_benchmark and torch_reference results into a markdown table.

    /usr/bin/python3 bench/compare.py gradcomp.json torch.json > table.md

Times are the best of several repetitions on both sides (other load on the
machine only ever adds time). Speed-up = PyTorch time / gradcomp time on the
same 25M-float input; "% of memcpy" = the faster memcpy's time (one thread
or all cores) / gradcomp time, both counted on the 100 MB fp32 input.
"""

import json
import sys
from typing import Dict, List, Optional, Tuple

# (gradcomp benchmark, what it does, [(torch case, note)]); a case of None
# prints the note alone (no PyTorch peer, and why).
ROWS: List[Tuple[str, str, List[Tuple[Optional[str], str]]]] = [
    ("BM_Memcpy", "memcpy 100 MB, 1 thread", [("clone", "allocates")]),
    ("BM_MemcpyParallel", "memcpy 100 MB, all cores",
     [("copy", "preallocated")]),
    ("BM_Encode/none", "encode none (fp32)", [("copy", "preallocated")]),
    ("BM_Encode/fp16", "encode fp16", [("half", "allocates"),
                                       ("half_copy", "preallocated")]),
    ("BM_Encode/bf16", "encode bf16", [("bfloat16", "allocates"),
                                       ("bfloat16_copy", "preallocated")]),
    ("BM_TopKSelect/10", "top-k select 0.001 (+ values)",
     [("topk_0.001", "")]),
    ("BM_TopKSelect/100", "top-k select 0.01 (+ values)",
     [("topk_0.01", "")]),
    ("BM_Encode/topk_0.001", "encode topk 0.001 (DGC step)",
     [("dgc_0.001", "in place")]),
    ("BM_Encode/topk_0.01", "encode topk 0.01 (DGC step)",
     [("dgc_0.01", "in place")]),
    ("BM_Encode/qsgd_4bit", "encode qsgd 4-bit", [("qsgd_4bit", "int8 levels, unpacked")]),
    ("BM_Decode/fp16", "decode-add fp16", [("half_decode", "")]),
    ("BM_Decode/topk_0.001", "decode-add topk 0.001",
     [("topk_decode_0.001", "")]),
    ("BM_Decode/topk_0.01", "decode-add topk 0.01",
     [("topk_decode_0.01", "")]),
    ("BM_Decode/qsgd_4bit", "decode-add qsgd 4-bit",
     [("qsgd_decode_4bit", "")]),
    ("BM_Encode/randomk_0.01", "encode randomk 0.01",
     [("randomk_0.01", "distinct indices"),
      ("randomk_randint_0.01", "with replacement")]),
    ("BM_Decode/randomk_0.01", "decode-add randomk 0.01",
     [("randomk_decode_0.01", "indices kept, not redrawn")]),
    ("BM_Encode/threshold", "encode threshold (tau_rms 2.5, EF)",
     [("threshold", "in place")]),
    ("BM_Decode/threshold", "decode-add threshold",
     [("threshold_decode", "")]),
    ("BM_Encode/terngrad", "encode terngrad",
     [("terngrad", "int8 ternary, unpacked")]),
    ("BM_Decode/terngrad", "decode-add terngrad",
     [("terngrad_decode", "")]),
    ("BM_Encode/int8", "encode int8", [("int8", "")]),
    ("BM_Encode/int8_stochastic", "encode int8 stochastic",
     [("int8_stochastic", "")]),
    ("BM_Decode/int8", "decode-add int8", [("int8_decode", "")]),
    ("BM_Decode/int8_stochastic", "decode-add int8 stochastic",
     [("int8_decode", "")]),
    ("BM_Encode/signsgd", "encode signsgd", [("signsgd", "")]),
    ("BM_Encode/signum", "encode signum", [("signum", "in place")]),
    ("BM_Encode/efsign", "encode efsign", [("efsign", "in place")]),
    ("BM_Decode/signsgd", "decode-add signsgd", [("sign_decode", "")]),
    ("BM_Decode/signum", "decode-add signum", [("sign_decode", "")]),
    ("BM_Decode/efsign", "decode-add efsign", [("sign_decode", "")]),
    ("BM_Encode/onebit", "encode onebit (EF)", [("onebit", "in place")]),
    ("BM_Decode/onebit", "decode-add onebit", [("onebit_decode", "")]),
    ("BM_Encode/atomo_entry_0.01", "encode atomo entry 0.01",
     [("atomo_entry_0.01", "")]),
    ("BM_Decode/atomo_entry_0.01", "decode-add atomo entry 0.01",
     [("atomo_entry_decode_0.01", "")]),
    ("BM_MatrixStep/powersgd_5000x5000",
     "powersgd rank 2 step, 5000 x 5000 (both rounds, decode, EF)",
     [("powersgd_5000x5000", "")]),
    ("BM_MatrixStep/atomo_512x4608", "atomo spectral step, 512 x 4608",
     [(None, "not written (an SVD per step)")]),
    ("BM_Encode/polar_4", "encode polar 4 bits (raw planes)",
     [(None, "no PyTorch formulation")]),
    ("BM_Decode/polar_4", "decode-add polar 4 bits",
     [(None, "no PyTorch formulation")]),
    ("BM_Encode/polar_2.5", "encode polar 2.5 bits (one SC-coded plane)",
     [(None, "no PyTorch formulation")]),
    ("BM_Decode/polar_2.5", "decode-add polar 2.5 bits",
     [(None, "no PyTorch formulation")]),
    ("BM_PhiloxFillUniform", "25M Philox uniforms, 1 thread", []),
]


def gradcomp_ms(path: str) -> Dict[str, float]:
    """Best real time (ms) over the repetitions of each benchmark."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    times: Dict[str, float] = {}
    for b in data["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        name = b["run_name"].replace("/real_time", "")
        assert b["time_unit"] == "ms", b
        times[name] = min(times.get(name, float("inf")), b["real_time"])
    return times


def wire_bytes(path: str) -> Dict[str, float]:
    """Payload size per encode benchmark (its wire_bytes counter)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return {b["run_name"].replace("/real_time", ""): b["wire_bytes"]
            for b in data["benchmarks"]
            if b.get("run_type") == "iteration" and "wire_bytes" in b}


def main() -> None:
    ours = gradcomp_ms(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        torch = json.load(f)
    # The stricter of the two copies: % of memcpy is of the machine's best.
    memcpy = min(ours["BM_Memcpy"], ours["BM_MemcpyParallel"])
    gb = 25_000_000 * 4 / 1e9
    print(f"PyTorch {torch['torch_version']}, {torch['threads']} threads.\n")
    print("| operation | gradcomp ms | GB/s (fp32 in) | % of memcpy "
          "| PyTorch peer | PyTorch ms | speed-up |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: |")
    for bench, what, peers in ROWS:
        if bench not in ours:
            continue
        ms = ours[bench]
        head = f"| {what} | {ms:.2f} | {gb / (ms / 1e3):.1f} | {100 * memcpy / ms:.0f} %"
        if not peers:
            print(f"{head} | | | |")
        for case, note in peers:
            if case is None or case not in torch["cases"]:
                print(f"{head} | {note or 'not run'} | | |")
                continue
            t = torch["cases"][case]
            # A | inside a table cell, code span or not, needs escaping.
            code = t["code"].replace("|", "\\|")
            label = f"`{code}`" + (f" ({note})" if note else "")
            print(f"{head} | {label} | {t['ms']:.2f} | {t['ms'] / ms:.1f}x |")
    # Codecs without a PyTorch peer in torch_reference.py: gradcomp only.
    listed = {bench for bench, _, _ in ROWS}
    for bench in sorted(set(ours) - listed):
        ms = ours[bench]
        what = bench.replace("BM_Encode/", "encode ").replace(
            "BM_Decode/", "decode-add ")
        print(f"| {what} | {ms:.2f} | {gb / (ms / 1e3):.1f} | "
              f"{100 * memcpy / ms:.0f} % | | | |")
    print("\n| codec | payload bytes | vs fp32 |")
    print("| --- | ---: | ---: |")
    for name, size in sorted(wire_bytes(sys.argv[1]).items()):
        codec = name.split("/", 1)[1]
        print(f"| {codec} | {size:,.0f} | {100e6 / size:.1f}x smaller |")


if __name__ == "__main__":
    main()
