"""The report of ``scripts/bench/benchmark.py``: the side-by-side table of the approaches (first pass, compile time,
steady state, tokens/s, speed ratios, MFU against the XLA matmul rate measured in the same run, peak RSS), (a)'s
forward and statistics step against that rate with its weight matmuls alone, and the largest relative score
difference between each two approaches (``bench_tools.max_rel_diff``)."""
from __future__ import annotations

from bench_tools import max_rel_diff


def report(args, results: dict, methods: list[str]) -> None:
    """The tables of a finished comparison: ``results`` maps "matmul" and each approach run ("a", "b", "c") to its
    worker's figures; ``methods`` are the scored methods (``benchmark.METHODS``)."""
    mm = results["matmul"]["matmul_gflops"]
    rate = mm["xla"] * 1e9
    first = next(r for k, r in results.items() if k != "matmul")
    n_tok, n_texts = first["n_tokens"], first["n_texts"]
    label = {"a": "(a) toolkit, packed", "b": "(b) published approach in JAX (per text, full log_softmax)",
             "c": "(c) published approach, transformers + torch (per text)"}
    print(f"\nmodel {args.model}, WikiMIA-{args.length}: {n_texts} texts, {n_tok} tokens, methods {' '.join(methods)}; "
          f"device {results['matmul']['device']}; tokens per batch {args.tokens_per_batch or 'default'} for (a)")
    print(f"float32 matmul 2048^3 measured in this run: XLA {mm['xla']:.0f} GFLOP/s, NumPy {mm['numpy']:.0f} GFLOP/s; "
          f"matmul precision {args.matmul_precision}")
    if "c" in results:
        print(f"(c): torch on {args.torch_device}, {results['c']['torch_threads']} threads, "
              f"OMP_WAIT_POLICY={args.omp_wait_policy}")
    peak = f" | MFU (vs {args.peak_tflops:g} TFLOP/s)" if args.peak_tflops else ""
    print()
    print("| approach | first pass (compiles) | compile time / compilations | steady state | tokens/s (steady) | "
          f"texts/s (steady) | x (c) | x (b) | MFU (steady, vs XLA matmul){peak} | peak RSS (above loaded) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if peak else ""))
    for k in ("a", "b", "c"):
        if k not in results:
            continue
        r = results[k]
        tps = n_tok / r["steady"]
        ratio = lambda o: f"{tps / (n_tok / results[o]['steady']):.2f}" if o in results else "-"  # noqa: E731
        mfu = r["model_flops"] / r["steady"] / rate
        comp = f"{r['compile_seconds_first']:.1f} s / {r['compiles_first']}" if k != "c" else "-"
        vs_peak = f" | {100 * r['model_flops'] / r['steady'] / (args.peak_tflops * 1e12):.1f}%" if peak else ""
        print(
            f"| {label[k]} | {r['first_pass']:.1f} s | {comp} | {r['steady']:.1f} s | {tps:.0f} | "
            f"{n_texts / r['steady']:.1f} | {ratio('c')} | "
            f"{ratio('b')} | {100 * mfu:.0f}%{vs_peak} | {r['peak_rss'] / 2**20:.0f} MiB "
            f"({(r['peak_rss'] - r['rss_after_load']) / 2**20:+.0f}) |"
        )
    if "a" in results:
        a = results["a"]
        print(f"\n(a): {a['programs']} scoring programs (step shapes); steady-state pass compiled "
              f"{a['compiles_steady']} more")
        for name in ("forward", "fused_stats_step"):
            f = a[name]
            g = f["flops"] / f["seconds"] / 1e9
            print(
                f"(a) {name.replace('_', ' ')} on [{f['shape'][0]}, {f['shape'][1]}] (with padding): "
                f"{f['seconds'] * 1e3:.1f} ms, "
                f"{g:.0f} GFLOP/s = {100 * g / mm['xla']:.0f}% of the XLA matmul rate "
                f"({100 * g / mm['numpy']:.0f}% of NumPy's)"
            )
        parts = a["matmuls_alone"]
        for name, part in parts.items():
            g = part["flops"] / part["seconds"] / 1e9
            print(f"(a) {name.replace('_', ' ')} matmuls alone on the same tokens: {part['seconds'] * 1e3:.1f} ms, "
                  f"{g:.0f} GFLOP/s = {100 * g / mm['xla']:.0f}% of the XLA matmul rate")
        rest = a["forward"]["seconds"] - sum(p["seconds"] for p in parts.values())
        print(f"(a) the rest of the forward (attention, norms, RoPE, activations, residuals): {rest * 1e3:.1f} ms = "
              f"{100 * rest / a['forward']['seconds']:.0f}% of it")
    # identical scores
    keys = [k for k in ("a", "b", "c") if k in results]
    for i, x in enumerate(keys):
        for y in keys[i + 1:]:
            worst = max_rel_diff(results[x]["scores"], results[y]["scores"], methods)
            print(
                f"max relative score difference ({x}) vs ({y}): " + ", ".join(f"{m} {w:.1e}" for m, w in worst.items())
            )
