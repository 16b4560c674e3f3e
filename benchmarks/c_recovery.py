"""Where should per-step c of a multi-step LSTM call be computed? Side by side, in one run, per call:

- **host** (what the probe does): the recovery's torch half on the call's device (``recover.lstm_sequence_parts``:
  lower layers' per-step h, each layer's input and i/f/g weight rows), one host copy (``transfer.Staged``),
  then ``recover.lstm_cells`` in numpy (one gate matmul per layer, then the c scan) in the job's second half;
- **device**: the same gates and scan in torch on the call's device (a batched gate matmul per layer, then
  one fused ``addcmul`` per step), then one host copy of h and c.

Both give c to ~1e-6 of each other (checked here). Prints the median milliseconds per call of each, the
training thread's share of it (host: the torch half and the copy; the numpy half runs in the job's second
half, on the training thread with a writer process, the writer thread otherwise) and device / host.

    python benchmarks/c_recovery.py                      # CPU
    python benchmarks/c_recovery.py --device cuda        # where CUDA is
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from lstm_probe.capture.recover import Scratch, lstm_assemble, lstm_cells, lstm_sequence_parts
from lstm_probe.capture.transfer import Staged


def device_cells(module: torch.nn.LSTM, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, y: torch.Tensor):
    """Per-step (h, c) of every layer, (L, T, N, H) each, computed on the call's device."""
    hidden = module.hidden_size
    hs, cs = [], []
    layer_in = x
    with torch.no_grad():
        for layer in range(module.num_layers):
            w_ih, w_hh = getattr(module, f"weight_ih_l{layer}"), getattr(module, f"weight_hh_l{layer}")
            if layer == module.num_layers - 1:
                out = y
            else:
                w = [w_ih, w_hh] + (
                    [getattr(module, f"bias_ih_l{layer}"), getattr(module, f"bias_hh_l{layer}")] if module.bias else []
                )
                out = torch.lstm(
                    layer_in,
                    (h0[layer : layer + 1], c0[layer : layer + 1]),
                    w,
                    module.bias,
                    1,
                    0.0,
                    False,
                    False,
                    False,
                )[0]
            h_prev = torch.cat((h0[layer : layer + 1], out[:-1]))
            gates = layer_in @ w_ih[: 3 * hidden].T + h_prev @ w_hh[: 3 * hidden].T
            if module.bias:
                gates += (
                    getattr(module, f"bias_ih_l{layer}")[: 3 * hidden]
                    + getattr(module, f"bias_hh_l{layer}")[: 3 * hidden]
                )
            i, f, g = gates.split(hidden, dim=-1)
            i, f, g = i.sigmoid(), f.sigmoid(), g.tanh()
            ig = i * g
            c = torch.empty_like(out)
            prev = c0[layer]
            for t in range(out.shape[0]):
                prev = torch.addcmul(ig[t], f[t], prev)
                c[t] = prev
            hs.append(out)
            cs.append(c)
            layer_in = out
    return Staged([torch.stack(hs), torch.stack(cs)]).arrays()


def host_cells(module: torch.nn.LSTM, x, h0, c0, y, scratch: Scratch):
    parts = lstm_sequence_parts(module, x, h0, c0, y)
    staged = Staged(parts)
    t_copy = time.perf_counter()
    arrays = staged.arrays()
    hs, cells = lstm_assemble(arrays, module.num_layers, module.bias, None)
    t_numpy = time.perf_counter()
    return hs, lstm_cells(hs, *cells, scratch=scratch, out=np.empty(hs.shape, np.float32)), t_copy, t_numpy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--shapes", default="128x1,64x2,16x8,128x64", help="TxN of the calls (sb3: T steps, N sequences)")
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(f"device {dev}, hidden {args.hidden}, one torch thread; ms per call, medians of {args.repeats}")
    print(
        f"{'layers':>6} {'T x N':>8} {'host':>8} {'(torch+copy)':>13} {'device':>8} {'device/host':>12} {'max rel err':>12}"
    )
    for layers in args.layers:
        module = torch.nn.LSTM(3, args.hidden, layers).to(dev)
        scratch = Scratch()
        for shape in args.shapes.split(","):
            steps, batch = (int(v) for v in shape.split("x"))
            x = torch.randn(steps, batch, 3, device=dev)
            h0 = torch.randn(layers, batch, args.hidden, device=dev) * 0.1
            c0 = torch.randn(layers, batch, args.hidden, device=dev) * 0.1
            with torch.no_grad():
                y = module(x, (h0, c0))[0]
            host, first, dev_t = [], [], []
            for _ in range(args.repeats):
                sync()
                t0 = time.perf_counter()
                _, cs, _, t_numpy = host_cells(module, x, h0, c0, y, scratch)
                t1 = time.perf_counter()
                host.append(t1 - t0)
                first.append(t_numpy - t0)
                sync()
                t0 = time.perf_counter()
                _, cs_d = device_cells(module, x, h0, c0, y)
                dev_t.append(time.perf_counter() - t0)
            err = float(np.max(np.abs(cs_d - cs) / np.maximum(np.abs(cs), 1e-3)))
            h, f, d = (1e3 * statistics.median(v) for v in (host, first, dev_t))
            print(f"{layers:>6} {shape:>8} {h:>8.3f} {f:>13.3f} {d:>8.3f} {d / h:>11.2f}x {err:>12.1e}")


if __name__ == "__main__":
    main()
