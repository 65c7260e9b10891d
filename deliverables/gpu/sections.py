"""Every GPU campaign step's Markdown section (the steps: deliverables/gpu/steps.py, profile.py)."""

from __future__ import annotations

from deliverables.common import table


def _f(x, fmt: str = ".3g"):
    return None if x is None else format(x, fmt)


def _pct(x, sign: bool = False):
    return None if x is None else f"{100 * x:{'+' if sign else ''}.1f}%"


def _pm(mean, std):
    return None if mean is None else f"{mean:.3g} +- {std or 0:.2g}"


def _status(r: dict, why: str = "reason", cut: int | None = None) -> str:
    return r["status"] if r["status"] == "ok" else f"{r['status']}: {(r.get(why) or '')[:cut]}"


def _attention(res: dict) -> str:
    rows = [[r["context"], r["window"] or "none", r["batch"], r["implementation"], _f(r.get("out_rel_err"), ".2e"),
             _f(r.get("grad_rel_err"), ".2e"), _pm(r.get("fwd_ms"), r.get("fwd_ms_std")), _f(r.get("predicted_fwd_ms")),
             _pm(r.get("fwd_bwd_ms"), r.get("fwd_bwd_ms_std")), _f(r.get("predicted_fwd_bwd_ms")),
             _status(r)] for r in res["rows"]]
    return ("bfloat16 inputs, compared by ||out - ref|| / ||ref|| with the float32 xla attention on the same "
            f"inputs; {res.get('tokens_per_call', '?')} tokens per call (batch = tokens / context), "
            f"{res.get('heads', '?')} heads of {res.get('head_dim', '?')}. Predicted: the roofline of the compiled "
            "call (deliverables/gpu/predict.py), not measured.\n\n"
            + table(["context", "window", "batch", "kernel", "out rel. err", "grad rel. err", "forward ms",
                      "predicted", "fwd+bwd ms", "predicted", "status"], rows))


def _bench(res: dict) -> str:
    rows = [[r["model"], r["mode"], r.get("attention"), r.get("remat"), r["context"], r.get("batch"),
             _status(r, "error", 80),
             _pm(r.get("step_ms"), r.get("step_ms_std")), _f(r.get("predicted_step_ms")),
             _f(r.get("measured_over_predicted"), ".2f"), _f(r.get("tokens_per_s"), ",.0f"),
             _f(r.get("predicted_tokens_per_s"), ",.0f"), _pct(r.get("mfu")), _pct(r.get("predicted_mfu")),
             _f(r.get("memory_gb")) if r.get("memory_source") == "memory_stats" else None,
             _f(r.get("estimate_gb")), _f(r.get("jaxlm_memory_estimate_gb"))] for r in res["rows"]]
    label = next((r["prediction"] for r in res["rows"] if r.get("prediction")), None)
    return ("Memory columns: device peak (the device's peak bytes in use since the process started), XLA's "
            "compiled estimate (`memory_analysis()` of this step), jaxlm.memory's analytic estimate. "
            + (f"Predicted columns: {label}." if label else "No row has a prediction.") + "\n\n"
            + table(["model", "mode", "attention", "remat", "context", "batch", "status", "step ms", "predicted ms",
                      "measured / predicted", "tokens/s", "predicted tokens/s", "MFU", "predicted MFU",
                      "device peak GB", "XLA estimate GB", "jaxlm.memory GB"], rows))


def _max_batch(res: dict) -> str:
    rows = [[r["attention"], r["remat"], r["context"], r.get("predicted"), r.get("probed"), r.get("largest_ok"),
             _status(r)] for r in res["rows"]]
    return ("Predicted: jaxlm.memory's largest batch for the device's memory; then one-step runs searched around "
            "it (the prediction first, then galloping and bisection) up to the largest batch that runs.\n\n"
            + table(["attention", "remat", "context", "predicted", "batches run", "largest that ran", "status"], rows))


def _roofline(r: dict) -> list[str]:
    """Per kernel group: the roofline's time against the trace's, per call of the traced program."""
    head = (f"Predicted against measured, per call ({r['label']}; compiled with {r['compiler']}): "
            f"{r['predicted_ms']:.3g} ms predicted, {r['measured_ms']:.3g} ms of kernel time measured "
            f"(measured / predicted {_f(r['measured_over_predicted'], '.2f')}, overall error of the prediction "
            f"{_pct(r['error'], sign=True)}, summed over the groups {_pct(r['group_abs_error'])}); "
            f"{100 * r['matched_share']:.0f}% of the trace's kernel time is matched to the program's kernels.")
    groups = [[g["group"], _f(g["predicted_ms"]), _f(g["measured_ms"]), _f(g["measured_over_predicted"], ".2f"),
               g["bound"] or "-"] for g in r["groups"]]
    kernels = [[f"`{k['kernel']}`", k["group"], f"`{k['op_name'][-60:]}`", _f(k["predicted_ms"]),
                _f(k["measured_ms"]), k["bound"]] for k in r["kernels"]]
    return ["", head, "", table(["group", "predicted ms", "measured ms", "measured / predicted", "bound"], groups),
            "", table(["kernel", "group", "jax op", "predicted ms", "measured ms", "bound"], kernels)]


def _profile(res: dict) -> str:
    parts = [f"`{res['model']}`, context {res['context']}, batch {res['batch']}, {res['dtype']}."]
    for mode in ("forward", "train_step", "attention"):
        s = res[mode]
        parts += ["", f"**{mode}**: matmul kernels take {100 * s['matmul_share']:.1f}% of "
                      f"{s['total_us'] / 1e3:.2f} ms of device time over the traced calls"
                  + (" (the rest of attention alone is the softmax, masking and scaling)."
                     if mode == "attention" else "."),
                  "", table(["kernel / op", "ms", "share", "matmul"],
                             [[f"`{t['name'][:70]}`", f"{t['us'] / 1e3:.3f}", f"{100 * t['share']:.1f}%",
                               "yes" if t["matmul"] else ""] for t in s["top"]])]
        if "roofline" in s:
            parts += _roofline(s["roofline"])
    return "\n".join(parts)


def _shakespeare(res: dict) -> str:
    hit = res.get("reached")
    first = f"reached at step {hit['step']}, {hit['seconds']:.0f} s after launch" if hit else "not reached"
    return (f"Command: `{res['command']}`\n\nRun: {res['status']}, {res['wall_s']:.0f} s wall in all (data "
            f"preparation and compilation included). Validation loss {res['target']}: {first}.\n\n"
            + table(["step", "val loss", "s since launch"],
                     [[e["step"], _f(e["val_loss"], ".4f"), _f(e["seconds"], ".0f")] for e in res["rows"]]))


def checks_section(checks: dict, preflight: dict | None) -> str:
    """The offline run's correctness smoke (deliverables/gpu/check.py) and the versions it ran with."""
    tol = checks["tolerances"]
    rows = []
    for r in checks["rows"]:
        if r["check"] == "attention":
            what = f"{r.get('implementation')}, window {r.get('window') or 'none'}"
            figures = (f"out {_f(r.get('out_rel_err'), '.2e')}, grad {_f(r.get('grad_rel_err'), '.2e')}"
                       if "out_rel_err" in r else "-")
        elif r["check"] == "train":
            what = f"{r.get('steps')} steps on {r.get('device')}"
            figures = f"max relative loss difference {_f(r.get('max_rel_diff'), '.2e')}"
        else:
            what, figures = "save, restore, greedy generation", f"arrays equal: {r.get('arrays_equal')}"
        status = {True: "pass", False: "FAIL", None: "skipped"}[r["ok"]]
        rows.append([r["check"], what, figures, status + (f": {r['reason']}" if r.get("reason") else "")])
    versions = (preflight or {}).get("versions", {})
    return (f"Tolerances: attention in bfloat16 against float32, ||out - ref|| / ||ref|| <= {tol['attention']['out']} "
            f"(gradients <= {tol['attention']['grad']}); bfloat16 training against float32 on the CPU, every "
            f"step's loss within {tol['train']:.0%}. Versions: "
            + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".\n\n"
            + table(["check", "what", "figures", "status"], rows))


SECTIONS = {"attention": _attention, "bench_bf16": _bench, "bench_f32": _bench, "techniques": _bench,
            "max_batch": _max_batch, "profile": _profile, "shakespeare": _shakespeare}


def section(name: str, res: dict) -> str:
    text = SECTIONS[name](res)
    return text + (f"\n\nCut short: {res['cut']}." if res.get("cut") else "")
