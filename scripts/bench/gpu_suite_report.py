"""The figures and the markdown tables of ``gpu_suite.py`` (``figures``: every named figure of a finished suite;
``report``: the tables it prints)."""
from __future__ import annotations

import statistics

from bench_tools import max_rel_diff
from benchmark import METHODS

from train.speed import window

LABEL = {"toolkit": "toolkit (packed rows, one jitted step)", "torch_batched": "transformers + torch, batched",
         "torch_loop": "transformers + torch, per-example loop (published)"}


def figures(args, out) -> None:
    """``out["figures"]``: every named figure (each computed from this run's measurements)."""
    fig, peak = out["figures"], args.peak_tflops * 1e12
    fig["suite.wall_s"] = out["suite"]["wall_s"]
    fig.update({f"part.{p['part'].replace(' ', '.')}.wall_s": p["wall_s"] for p in out["parts"] if "wall_s" in p})
    for shape, facts in out["shapes"].items():
        fig[f"{shape}.parameters"], fig[f"{shape}.build_s"] = facts["parameters"], facts["build_s"]
        res = out["results"].get(shape, {})
        flops = res.get("toolkit_cold", {}).get("flops")
        for kind in ("toolkit_cold", "toolkit_warm", "torch_batched", "torch_loop"):
            r = res.get(kind)
            if r is None:
                continue
            r["steady_s"] = statistics.median(r["passes_s"])
            r["tokens_per_s"] = facts["n_tokens"] / r["steady_s"]
            key = f"{shape}.{kind}"
            fig.update({f"{key}.load_s": r["load_s"], f"{key}.first_pass_s": r["first_pass_s"],
                        f"{key}.steady_s": r["steady_s"], f"{key}.tokens_per_s": r["tokens_per_s"]})
            if r.get("device_peak"):
                fig[f"{key}.device_peak_bytes"] = r["device_peak"]
            if flops:
                r["mfu"] = flops / r["steady_s"] / peak
                fig[f"{key}.mfu"] = r["mfu"]
            if kind == "toolkit_cold":
                r["device_step_s"] = statistics.median(r["device_step_passes_s"])
                fig[f"{key}.device_step_s"] = r["device_step_s"]
                if flops:
                    r["device_step_mfu"] = flops / r["device_step_s"] / peak
                    fig[f"{key}.device_step_mfu"] = r["device_step_mfu"]
                fig.update({f"{key}.phase.{k}_s": v for k, v in r["phases_s"].items()})
                r["step_part_s"] = {k: statistics.median(v) for k, v in r["step_parts_s"].items()}
                fig.update({f"{key}.part.{k}_s": v for k, v in r["step_part_s"].items()})
                fig[f"{key}.compile_s"] = r["compile"]["seconds"]
                fig[f"{key}.programs_compiled"] = r["compile"]["compiled"]
                fig[f"{key}.tokens_per_slot"] = r["report"]["tokens"] / r["report"]["slots"]
            if kind == "toolkit_warm":
                fig[f"{key}.compile_s"] = r["compile"]["seconds"]
                fig[f"{key}.cache_hits"] = r["compile"]["cache_hits"]
        for kind in ("torch_batched", "torch_loop"):
            if "toolkit_cold" in res and kind in res:
                fig[f"{shape}.toolkit_x_{kind}"] = res[kind]["steady_s"] / res["toolkit_cold"]["steady_s"]
    train = out["results"].get(args.train_shape, {}).get("train", {}).get("results")
    if train:
        flops = train["data"]["flops"]
        targs = out["results"][args.train_shape]["train"]["args"]
        tokens = targs["batch_size"] * targs["seq_len"]
        for k in ("jax", "torch"):
            if k in train:
                step = statistics.mean(train[k]["step_s"])
                train[k].update(step_mean_s=step, tokens_per_s=tokens / step, mfu=flops / step / peak)
                fig.update({f"train.{k}.step_s": step, f"train.{k}.warmup_s": train[k]["warmup_s"],
                            f"train.{k}.tokens_per_s": tokens / step, f"train.{k}.mfu": flops / step / peak})
        if "jax" in train and "torch" in train:
            fig["train.jax_x_torch"] = train["jax"]["tokens_per_s"] / train["torch"]["tokens_per_s"]
    trainer_figures(args, out)


def trainer_figures(args, out) -> None:
    """The trainer part's windows (gpu_suite.py's docstring, part 4) from its speed.jsonl lines."""
    r = out["results"].get(getattr(args, "trainer_shape", None), {}).get("trainer")
    if not r:
        return
    fig, w, by_step = out["figures"], r["window"], {line["step"]: line for line in r["lines"]}
    r["no_save"] = window([by_step[s] for s in range(2, w)])
    r["save_window"] = window([by_step[s] for s in range(w + 1, 2 * w + 1)])
    r["compile_s"], r["first_save_blocking_s"] = by_step[1]["seconds"], by_step[w]["save_s"]
    r["save_blocking_s"] = by_step[2 * w]["save_s"]
    r["steps_during_write"] = sum(1 for s in range(w + 1, 2 * w + 1) if by_step[s].get("saving"))
    fig.update({f"trainer.{k}": r[k] for k in ("compile_s", "first_save_blocking_s", "save_blocking_s",
                                               "checkpoint_bytes")})
    for name, win in (("trainer", r["no_save"]), ("trainer.save_window", r["save_window"])):
        fig.update({f"{name}.{k}": win[k] for k in ("step_s", "tokens_per_s", "mfu") if win[k] is not None})
    if r["no_save"]["step_s"] and r["save_window"]["step_s"]:
        fig["trainer.save_window_x"] = r["save_window"]["step_s"] / r["no_save"]["step_s"]
    if r.get("device_peak"):
        fig["trainer.device_peak_bytes"] = r["device_peak"]


def _mib(x):
    return f"{x / 2**20:.0f} MiB" if x else "-"


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%" if x >= 1e-3 else f"{100 * x:.1e}%"


def report(args, out) -> None:
    shapes, res_all = out["shapes"], out["results"]
    devices = sorted({r["device"] for res in res_all.values() for k, r in res.items() if k != "train"})
    versions = {k: v for res in res_all.values() for k, r in res.items() if k != "train"
                for k, v in r.get("versions", {}).items()}
    print(f"\n## Accelerator suite\n\ndevice: {'; '.join(devices) or '-'}; host CPU: {out['suite']['cpu']}; "
          f"{', '.join(f'{k} {v}' for k, v in sorted(versions.items()))}; XLA_FLAGS={out['suite']['xla_flags']!r}")
    if any(k in res for res in res_all.values() for k in SCORING):  # the scoring parts ran
        scoring_tables(args, out)
    train = res_all.get(args.train_shape, {}).get("train", {}).get("results")
    if train:
        print(f"\n### Training step, bfloat16 compute ({args.train_shape}; scripts/bench/benchmark_train.py)\n")
        print("| approach | warm-up step | step (mean) | tokens/s | x torch | MFU | device peak | loss first -> last |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for k in ("jax", "torch"):
            if k in train:
                r = train[k]
                x = f"{r['tokens_per_s'] / train['torch']['tokens_per_s']:.2f}" if "torch" in train else "-"
                print(f"| {k} | {r['warmup_s']:.1f} s | {r['step_mean_s']:.3f} s | {r['tokens_per_s']:.0f} | {x} | "
                      f"{_pct(r['mfu'])} | {_mib(r.get('device_peak'))} | {r['losses'][0]:.4f} -> "
                      f"{r['losses'][-1]:.4f} |")
    trainer_report(args, out)
    print("\n### Parts\n\n| part | status | wall |\n|---|---|---:|")
    for shape, facts in shapes.items():
        print(f"| {shape} weights (NumPy) + token ids | ok | {facts['build_s']:.1f} s |")
    for p in out["parts"]:
        status = p["status"] + (f": {p['reason']}" if p.get("reason") else "")
        wall = f"{p['wall_s']:.1f} s" if "wall_s" in p else "-"
        print(f"| {p['part']} | {status} | {wall} |")
    print(f"| the whole suite | budget {args.budget_s:.0f} s | {out['suite']['wall_s']:.1f} s |")


SCORING = ("toolkit_cold", "toolkit_warm", "torch_batched", "torch_loop")


def scoring_tables(args, out) -> None:
    """The scoring parts' tables (after ``figures``)."""
    shapes, res_all, peak = out["shapes"], out["results"], args.peak_tflops
    any_shape = next(iter(shapes.values()))
    print(f"texts: WikiMIA-{args.length}, {any_shape['n_texts']} texts; methods {' '.join(METHODS)}; MFU against "
          f"{peak:g} TFLOP/s (--peak-tflops); the toolkit in {args.dtype}, torch in bfloat16 (sdpa); steady pass: "
          f"median of passes adding up to {args.min_seconds:g} s")
    print("\n### Scoring with the toolkit: compile (cold / warm persistent cache) and throughput\n")
    print("| shape | parameters | tokens | tokens per batch | programs | padding | cold: compile s (compiled) | "
          "cold: first pass | warm: compile s (cache hits) | warm: first pass | steady pass | tokens/s | MFU | "
          "device steps alone | MFU (device steps) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for shape, facts in shapes.items():
        cold, warm = res_all.get(shape, {}).get("toolkit_cold"), res_all.get(shape, {}).get("toolkit_warm")
        if cold is None:
            continue
        rep = cold["report"]
        w = (f"{warm['compile']['seconds']:.2f} s ({warm['compile']['cache_hits']} of {warm['compile']['programs']})",
             f"{warm['first_pass_s']:.2f} s") if warm else ("-", "-")
        print(f"| {shape} | {facts['parameters'] / 1e6:.1f} M | {facts['n_tokens']} | {cold['tokens_per_batch']} | "
              f"{rep['scoring_programs']} | {100 * (1 - rep['tokens'] / rep['slots']):.1f}% | "
              f"{cold['compile']['seconds']:.2f} s ({cold['compile']['compiled']} of {cold['compile']['programs']}) | "
              f"{cold['first_pass_s']:.2f} s | {w[0]} | {w[1]} | {cold['steady_s'] * 1e3:.1f} ms | "
              f"{cold['tokens_per_s']:.0f} | {_pct(cold.get('mfu'))} | {cold['device_step_s'] * 1e3:.1f} ms | "
              f"{_pct(cold.get('device_step_mfu'))} |")
    for shape in shapes:
        cold = res_all.get(shape, {}).get("toolkit_cold")
        if cold is not None:
            ph = cold["phases_s"]
            print(f"\n{shape}, one more pass ({ph['wall'] * 1e3:.1f} ms) by phase: " + ", ".join(
                f"{k} {ph[k] * 1e3:.1f} ms" for k in ("encode", "plan", "dispatch", "finish", "rest")) +
                " (finish includes waiting for the device)")
            part, whole = cold["step_part_s"], cold["device_step_s"]
            print(f"\n{shape}, the device steps by part, each part its own program over the same batches (medians): "
                  f"the forward {part['forward'] * 1e3:.1f} ms; the forward and the statistics "
                  f"{part['statistics'] * 1e3:.1f} ms; the whole step {whole * 1e3:.1f} ms")
    print("\n### Side by side on the same device and token ids\n")
    print("| shape | approach | load | first pass | steady pass | tokens/s | texts/s | x torch batched | "
          "x per-example | MFU | device peak |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    agreement = []  # printed below the table, which a line of text would cut in two
    for shape, facts in shapes.items():
        res = res_all.get(shape, {})
        for kind in ("toolkit_cold", "torch_batched", "torch_loop"):
            r = res.get(kind)
            if r is None:
                continue
            ratio = lambda o: f"{res[o]['steady_s'] / r['steady_s']:.2f}" if o in res else "-"  # noqa: E731
            label = LABEL["toolkit" if kind == "toolkit_cold" else kind]
            if kind == "torch_batched":
                label += f" ({r['batch_size']} per forward, right padding)"
            print(f"| {shape} | {label} | {r['load_s']:.1f} s | {r['first_pass_s']:.2f} s | "
                  f"{r['steady_s'] * 1e3:.1f} ms | {r['tokens_per_s']:.0f} | {facts['n_texts'] / r['steady_s']:.1f} | "
                  f"{ratio('torch_batched')} | {ratio('torch_loop')} | {_pct(r.get('mfu'))} | "
                  f"{_mib(r.get('device_peak'))} |")
        pairs = (("toolkit_cold", "torch_batched"), ("toolkit_cold", "torch_loop"), ("torch_batched", "torch_loop"))
        for a, b in pairs:
            if a in res and b in res:
                worst = max_rel_diff(res[a]["scores"], res[b]["scores"], METHODS)
                agreement.append(f"{shape}: max relative score difference {a} vs {b}: "
                                 + ", ".join(f"{m} {d:.1e}" for m, d in worst.items()))
    for line in agreement:
        print(f"\n{line}")


def trainer_report(args, out) -> None:
    """The trainer part's table (after ``figures``)."""
    r = out["results"].get(getattr(args, "trainer_shape", None), {}).get("trainer")
    if not r or "no_save" not in r:
        return
    w = r["window"]
    print(f"\n### The trainer at {args.trainer_shape} (train.trainer.train: bfloat16 compute, float32 master weights "
          f"and AdamW, mesh {r['mesh']}, remat {r['remat']}, {r['batch_size']} x {r['seq_len']} tokens a step, "
          "asynchronous Orbax checkpoints; speed.jsonl)\n")
    print("| window | steps | step (mean) | tokens/s | MFU |")
    print("|---|---:|---:|---:|---:|")
    for label, win in ((f"steps 2..{w - 1}, no save", r["no_save"]),
                       (f"steps {w + 1}..{2 * w}: the save of step {w} written, the save of step {2 * w}",
                        r["save_window"])):
        step = f"{win['step_s'] * 1e3:.1f} ms" if win["step_s"] else "-"
        rate = f"{win['tokens_per_s']:.0f}" if win["tokens_per_s"] else "-"
        print(f"| {label} | {win['steps']} | {step} | {rate} | {_pct(win['mfu'])} |")
    x = out["figures"].get("trainer.save_window_x")
    added = f"{100 * (x - 1):+.1f}%" if x else "-"
    print(f"\nfirst step (compilation included): {r['compile_s']:.1f} s; a checkpoint of "
          f"{r['checkpoint_bytes'] / 2**30:.2f} GiB every {w} steps: its blocking part (device-to-host copy) "
          f"{r['save_blocking_s'] * 1e3:.0f} ms (the first save's, host buffers allocated: "
          f"{r['first_save_blocking_s'] * 1e3:.0f} ms); the mean step time with a save in the window {added} against "
          f"none; steps that began while a checkpoint was being written: {r['steps_during_write']} of {w}; MFU against "
          f"{args.peak_tflops:g} TFLOP/s x {r['devices']} device(s); device peak {_mib(r.get('device_peak'))}")
