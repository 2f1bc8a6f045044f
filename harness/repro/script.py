"""Rerun one failing check of a `harness` sweep on a card, without the harness.

    python repro.py --device cuda:0     # or npu:0 (needs torch_npu), or cpu
    python repro.py --device npu:0 --model /path/to/model.pt   # where the weights were not copied

Written by `harness repro RUN_ID` into a folder beside this script:
  manifest.json  the check as the run recorded it, the card, the dtype, the versions and the
                 precision settings, the sha256 of the inputs and of the weights, where they came from
  inputs.npz     the exact batch the card was given (obs0, obs1, ...: one per observation input; noise)
  outputs.npz    card/<output>, golden/<output> (float64), cpu_same/<output> (the CPU computing
                 in the card's dtype) and, for a cross-card check, the other card's
  model.pt       the card's copy of the policy, in its dtype, traced on the card with torch.jit
                 (absent where the owner kept the weights: ask for it, and pass --model)

It loads the model on the device named (never another: no device, no run), runs it on the batch
and prints the mismatch the check found, computed from this run's outputs: against the golden
(the port rule: the card's error over the CPU's own error in the dtype), against the other card
(bit for bit), or the decisions that flip. Exit 1: the mismatch is there; 0: it is not; 2: it
cannot run here. Needs torch and numpy only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def weights_sha256(model: Any) -> str:
    """Of every parameter and buffer of a torch module, by name, dtype, shape and bytes."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True, help="cuda:N, npu:N or cpu: where the card's model runs")
    parser.add_argument("--model", default=str(HERE / "model.pt"), help="the card's traced model (default: model.pt here)")
    args = parser.parse_args(argv)
    manifest = json.loads((HERE / "manifest.json").read_text())
    try:
        torch = _torch_on(args.device)
        model = _load(torch, Path(args.model), args.device, manifest["weights"])
    except Unavailable as exc:
        print(f"repro: {exc}", file=sys.stderr)
        return 2
    import numpy as np

    check = manifest["check"]
    inputs = np.load(HERE / "inputs.npz")
    obs = [torch.from_numpy(inputs[f"obs{i}"]).to(args.device) for i in range(manifest["input"]["n_obs"])]
    with torch.no_grad():
        got = model(*obs, torch.from_numpy(inputs["noise"]).to(args.device))
    # Floating outputs widened to float32 as the harness records them (numpy has no bfloat16).
    rerun = {
        name: (t.float() if t.is_floating_point() else t).cpu().numpy()
        for name, t in zip(manifest["outputs"], got, strict=True)
    }
    recorded = np.load(HERE / "outputs.npz")
    output = check["output"]
    card = rerun[output]
    print(
        f"{manifest['run_id']}: {check['kind']} of {check['policy']} {check['dtype']} {check['workload']} {output}, "
        f"{check['device_a']} (recorded: {'PASS' if check['passed'] else 'FAIL'}); rerun on {args.device}"
    )
    print(f"this rerun against the card's output in the run: {_bitwise(card, recorded[f'card/{output}'])}")
    if check["kind"] == "cross_card":
        other = recorded[f"other/{output}"]
        failed = not _equal(card, other)
        print(f"{'FAIL' if failed else 'PASS'} against {check['device_b']} bit for bit: {_bitwise(card, other)}")
    elif check["kind"] == "decisions":
        gold = recorded[f"golden/{output}"]
        flips = np.flatnonzero((card != gold).reshape(len(card), -1).any(axis=1))
        failed = flips.size > 0
        verdict = "FAIL" if failed else "PASS"
        print(f"{verdict}: {flips.size} of {len(card)} rows decide otherwise than the golden (rows {flips[:10].tolist()})")
    else:
        failed = _port_rule(np, card, recorded[f"cpu_same/{output}"], recorded[f"golden/{output}"], manifest, check)
    return 1 if failed else 0


class Unavailable(Exception):
    """What keeps the script from running here: one line."""


def _torch_on(device: str) -> Any:
    """torch, with the device's backend: torch_npu for npu, CUDA for cuda; Unavailable where the
    device is not there (never a silent run on another)."""
    named = re.fullmatch(r"(cpu|cuda|npu)(?::([0-9]+))?", device)
    if named is None:
        raise Unavailable(f"--device {device}: expected cuda:N, npu:N or cpu")
    kind, index = named.group(1), named.group(2)
    if kind == "cpu" and index not in (None, "0"):
        # torch takes any index on the CPU and runs on the one CPU there is: never that silently.
        raise Unavailable(f"--device {device}: there is one CPU device, cpu")
    if kind != "npu":
        # An installed torch_npu without its CANN toolkit breaks `import torch`; only npu needs it.
        os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    import torch

    if kind == "npu":
        try:
            import torch_npu  # noqa: F401
        except ImportError as exc:
            raise Unavailable(f"--device {device}: torch_npu does not import ({exc})") from None
    if kind == "cpu":
        return torch
    backend: Any = getattr(torch, kind, None)
    count = backend.device_count() if backend is not None and backend.is_available() else 0
    if count == 0:
        raise Unavailable(f"--device {device}: no {kind} device is available here")
    if index is not None and int(index) >= count:
        raise Unavailable(f"--device {device}: this machine has {count} {kind} device(s)")
    return torch


def _load(torch: Any, path: Path, device: str, weights: dict[str, Any]) -> Any:
    if not path.is_file():
        raise Unavailable(
            f"{path}: no model; the weights were not copied into this folder (sha256 {weights['sha256']}, from "
            f"{weights['origin']}): ask for the card's model.pt and pass --model"
        )
    try:
        model = torch.jit.load(str(path), map_location=device)
    except (RuntimeError, ValueError, OSError) as exc:  # a damaged or foreign file: not the mismatch (exit 1)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise Unavailable(f"{path}: not a model torch.jit can load ({first})") from None
    digest = weights_sha256(model)
    if digest != weights["sha256"]:
        raise Unavailable(f"{path}: its weights' sha256 is {digest}, the run's card held {weights['sha256']}")
    return model


def _equal(a: Any, b: Any) -> bool:
    import numpy as np

    return bool(a.shape == b.shape and np.array_equal(a, b, equal_nan=True))


def _bitwise(a: Any, b: Any) -> str:
    import numpy as np

    if a.shape != b.shape:
        return f"shapes differ, {a.shape} and {b.shape}"
    differ = ~((a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else (a == b))
    if not differ.any():
        return "equal bit for bit"
    first = tuple(int(i) for i in np.argwhere(differ)[0])
    return f"{int(differ.sum())} of {a.size} values differ, first at {first}: {a[first]!r} and {b[first]!r}"


def _port_rule(np: Any, card: Any, cpu_same: Any, golden: Any, manifest: dict[str, Any], check: dict[str, Any]) -> bool:
    """The port rule (harness/judge/golden.py) on this rerun: True where it fails."""
    card, cpu, gold = (np.asarray(x, dtype=np.float64) for x in (card, cpu_same, golden))
    bad = ~np.isfinite(card) & np.isfinite(gold)
    if bad.any():
        print(f"FAIL: {int(bad.sum())} of {card.size} values not finite on the card where the golden is")
        return True
    eps = 2.0 ** -manifest["dtype"]["mantissa_bits"]
    limit = check["ratio_limit"]

    def rms(x: Any) -> float:
        return float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0

    card_rmse, cpu_rmse = rms(card - gold), rms(cpu - gold)
    card_max, cpu_max = float(np.abs(card - gold).max()), float(np.abs(cpu - gold).max())
    error_ratio = card_rmse / max(cpu_rmse, 0.5 * eps * rms(gold))
    max_ratio = card_max / max(cpu_max, 0.5 * eps * float(np.abs(gold).max()))
    failed = not (error_ratio <= limit and max_ratio <= limit)
    print(
        f"{'FAIL' if failed else 'PASS'}: error_ratio {error_ratio:.4g} and max_ratio {max_ratio:.4g} against the limit "
        f"{limit:g} (the run recorded {check['error_ratio']:.4g} and {check['max_ratio']:.4g}); RMSE against the float64 "
        f"golden {card_rmse:.4g}, the CPU's in {manifest['dtype']['label']} {cpu_rmse:.4g}; largest error {card_max:.4g}, "
        f"the CPU's {cpu_max:.4g}"
    )
    return failed


if __name__ == "__main__":
    sys.exit(main())
