#!/usr/bin/python3
"""Reference for cubevec's UniPCMultistepScheduler (pipelines/unipc.h): the scheduler the diffusers
Wan2.1 repos ship (assets/configs/wan2.1-t2v-14b/scheduler/scheduler_config.json).

Run with Debian's torch (1.13), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_unipc_reference.py [OUTPUT_DIR]   # default tests/data

It writes OUTPUT_DIR/unipc_reference.safetensors, read by tests/pipelines/unipc_test.cpp.

This is an independent implementation of the algorithm (UniPC, Zhao et al. 2023, as configured by
diffusers for flow matching: flow_prediction, use_flow_sigmas, predict_x0, solver_type "bh2",
lower_order_final, final_sigmas_type "zero", no thresholding, corrector everywhere); diffusers is
not imported. It follows the *precision* diffusers' scheduling_unipc_multistep.py uses at every
point, which is what the notes below record.

Notation: N inference steps, T = num_train_timesteps (1000), s = flow_shift. Step i (0 <= i < N)
takes the model output v_i at the sample x_i and sigma_i, and returns x_{i+1} at sigma_{i+1}.
For flow matching alpha(sigma) = 1 - sigma, and the log-SNR is lambda(sigma) = log(1 - sigma) -
log(sigma); the data prediction is x0_i = x_i - sigma_i * v_i.

Subtle details (each one changes numbers):

 1. Sigma grid, float64 numpy. u = np.linspace(1, 1/T, N + 1) with its last point (1/T) dropped;
    numpy builds it as u_k = k * step + 1.0 with step = (1/T - 1) / N (a product, then a sum; the
    endpoint assignment of linspace only touches the dropped point). Shift in float64:
    sigma_k = s * u_k / (1 + (s - 1) * u_k). The flow-shift map fixes 1, so sigma_0 == 1 (up to a
    rounding of s - 1) and the rule "if |sigma_0 - 1| < 1e-6: sigma_0 -= 1e-6" always fires,
    giving sigma_0 = 0.999999 (float64), so that log(alpha_0) = log(1e-6) is finite.
 2. Timesteps are int64(float64 sigma_k * T), a *truncation* of the float64 values (before the
    float32 cast of the sigmas): the first one is 999, not 1000. The model is given these
    integers. (timestep_spacing / steps_offset only shape a grid that the flow-sigma branch then
    overwrites, so they do not matter.)
 3. Sigmas are then cast to float32 once, with a final 0 appended (final_sigmas_type "zero"):
    N + 1 values. Everything in step() reads these float32 values.
 4. step() keeps the sample in float32. Every scalar (alpha = 1 - sigma, log, lambda, h, expm1,
    the b coefficients, r_k) is a 0-dim float32 torch tensor, so each scalar operation rounds to
    float32; scalar products are formed before they multiply a tensor (Python evaluates
    `c1 * c2 * tensor` left to right). torch's float32 log / expm1 are not glibc's logf / expm1f
    (about 1% of arguments differ by 1 ulp), so no C++ port is bit-exact; the test compares the
    trajectories to 1e-5 of their scale. A float64 rerun of the same trajectories (the sample and
    every scalar in float64 from the same float32 sigmas) is computed as a sanity check; its
    distance is recorded in the metadata ("_f64_drift").
 5. x0_i = x_i - sigma_i * v_i: sigma_i is the float32 sigma; with a bf16 model output the
    product is rounded to bf16 before the float32 subtraction (not exercised here: v is f32).
 6. Orders: p_i = min(solver_order, N - i, i + 1) (the warm-up counter of diffusers is i + 1
    capped at solver_order). So step 0 is first order, the last step is first order
    (lower_order_final), and with N <= 2 every step is first order.
 7. Predictor UniP-p (predict_x0, bh2), from sigma_i (s0) to sigma_{i+1} (t), with
    h = lambda_t - lambda_s0, phi = expm1(-h) and B(h) = expm1(-h) (bh2; bh1 would be -h):
        x_{i+1} = (sigma_t / sigma_s0) * x_i - (alpha_t * phi) * x0_i
                  [p = 2:] - (alpha_t * B(h)) * (0.5 * D),  D = (x0_{i-1} - x0_i) / r,
        r = (lambda(sigma_{i-1}) - lambda_s0) / h   (negative: the earlier point is noisier).
    The 0.5 for p = 2 is a fixed value, not the solution of the 1x1 system (which would be b_1).
 8. Corrector UniC-p at step i > 0, with p = the previous step's predictor order: the model output
    v_i is evaluated at the *uncorrected* predictor output x_i, converted to x0_i from that same
    uncorrected x_i, and then x_i is replaced by
        x_i^c = (sigma_i / sigma_{i-1}) * x_{i-1}^c - (alpha_i * phi) * x0_{i-1}
                - (alpha_i * B(h)) * (rho_1 * D + rho_last * (x0_i - x0_{i-1}))
    where h = lambda_i - lambda_{i-1}, x_{i-1}^c is the (corrected) sample the previous predictor
    started from, D = (x0_{i-2} - x0_{i-1}) / r, r = (lambda_{i-2} - lambda_{i-1}) / h and, for
    p = 1, rho = [0.5] (fixed, and no D term); for p = 2, rho solves [[1, 1], [r, 1]] rho = b
    (torch.linalg.solve in float32) with, writing hh = -h, g_1 = phi / hh - 1, g_2 = g_1 / hh - 1/2:
        b_1 = g_1 * 1 / B(h),   b_2 = g_2 * 2 / B(h).
    The predictor of step i then starts from x_i^c, and x0_i (from the uncorrected sample) is what
    enters the history. x_{i-1}^c, x0_{i-1} and x0_{i-2} are the state kept between steps.
 9. Last step: sigma_N = 0, so lambda_t = log(1) - log(0) = +inf, h = +inf, expm1(-inf) = -1,
    the ratio sigma_t / sigma_s0 = 0: x_N = x0_{N-1} (0 * x + x0). The corrector that ran at the
    start of that step therefore does not change the result. Without lower_order_final the last
    step would be second order with r = 0 and D = (..)/0: not finite (cubevec rejects that config).
10. The pipeline calls set_begin_index(0), so step i uses sigma_i: the timestep passed to step()
    is not looked up.

File layout (all F32 unless noted; timesteps are stored as I32, the int64 values fit):
  model.A [4, 4], model.b [1, 4, 2, 3, 3], noise [1, 4, 2, 3, 3]: the synthetic model
      v(x, t) = sum_k A[c, k] x[:, k] + b * (t / 1000)   (t the integer timestep), evaluated in
      float64 from the float32 x and rounded to float32.
  <case>.sigmas [N + 1], <case>.timesteps [N] I32,
  <case>.trajectory [N + 1, 1, 4, 2, 3, 3] (row 0 is the noise, row i + 1 the output of step i),
  <case>.model_outputs [N, 1, 4, 2, 3, 3] (v_i as the model returned it at step i).
  grid.shift_<s>.sigmas / .timesteps: the sigma grid and timesteps for N = 1 .. 100 concatenated
      (N + 1 sigmas and N timesteps each, N ascending).
  __metadata__: <case> -> {"steps": N, "config": scheduler_config.json contents}; "_grid",
      "_f64_drift", "_generator", "_description".
Deterministic (fixed seed): regenerating with the same torch gives the same bytes.
"""
import json
import os
import sys

import numpy as np
import torch

from safetensors_io import read_safetensors, write_safetensors

torch.set_num_threads(1)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data")
GENERATOR = "tests/reference/make_unipc_reference.py"

SHIPPED = {
    "_class_name": "UniPCMultistepScheduler",
    "flow_shift": 3.0,
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "solver_order": 2,
    "solver_type": "bh2",
    "predict_x0": True,
    "lower_order_final": True,
    "final_sigmas_type": "zero",
}
SHAPE = (1, 4, 2, 3, 3)


# ---------------------------------------------------------------------------------------------
# set_timesteps (notes 1-3)
# ---------------------------------------------------------------------------------------------
def flow_grid(steps, shift, train_steps=1000):
    """(float32 sigmas [steps + 1] ending in 0, int64 timesteps [steps])."""
    u = np.linspace(1.0, 1.0 / train_steps, steps + 1)[:steps]  # float64
    sig = shift * u / (1.0 + (shift - 1.0) * u)
    if abs(sig[0] - 1.0) < 1e-6:
        sig[0] = sig[0] - 1e-6
    ts = (sig * train_steps).astype(np.int64)  # truncation toward zero, as torch's .to(int64)
    return np.concatenate([sig, [0.0]]).astype(np.float32), ts


# ---------------------------------------------------------------------------------------------
# The multistep predictor-corrector (notes 4-10)
# ---------------------------------------------------------------------------------------------
class UniPC:
    """The bh2 / predict_x0 / flow UniPC on float32 sigmas. `dtype` is the working precision of
    the sample and of every scalar: float32 reproduces diffusers, float64 is the sanity rerun."""

    def __init__(self, sigmas_f32, solver_order, dtype):
        self.sig = torch.from_numpy(sigmas_f32).to(dtype)  # float32 values, possibly widened
        self.n = len(sigmas_f32) - 1
        self.order = solver_order
        self.dtype = dtype
        self.i = 0
        self.x0s = []  # data predictions, oldest first, at most solver_order of them
        self.base = None  # the (corrected) sample the last predictor started from
        self.base_order = 0  # that predictor's order

    def lam(self, k):
        s = self.sig[k]
        return torch.log(1 - s) - torch.log(s)

    def phis(self, t_index, s_index):
        """h, expm1(-h) (= B(h) for bh2) between sigma[s_index] and sigma[t_index]."""
        h = self.lam(t_index) - self.lam(s_index)
        return h, torch.expm1(-h)

    def correct(self, x0_new, x):
        i, p = self.i, self.base_order
        m_prev = self.x0s[-1]
        h, phi = self.phis(i, i - 1)
        alpha = 1 - self.sig[i]
        if p == 1:
            rho_d, rho_last, d = None, torch.tensor(0.5, dtype=self.dtype), None
        else:
            r = (self.lam(i - 2) - self.lam(i - 1)) / h
            hh = -h
            g1 = phi / hh - 1
            g2 = g1 / hh - 0.5
            b = torch.stack([g1 * 1 / phi, g2 * 2 / phi])
            system = torch.stack([torch.ones((), dtype=self.dtype), torch.ones((), dtype=self.dtype),
                                  r, torch.ones((), dtype=self.dtype)]).reshape(2, 2)
            rho = torch.linalg.solve(system, b)
            rho_d, rho_last = rho[0], rho[1]
            d = (self.x0s[-2] - m_prev) / r
        ratio = self.sig[i] / self.sig[i - 1]
        out = ratio * self.base - alpha * phi * m_prev
        res = rho_last * (x0_new - m_prev)
        if d is not None:
            res = rho_d * d + res
        return out - alpha * phi * res

    def predict(self, x, p):
        i = self.i
        m_now = self.x0s[-1]
        h, phi = self.phis(i + 1, i)
        alpha = 1 - self.sig[i + 1]
        out = self.sig[i + 1] / self.sig[i] * x - alpha * phi * m_now
        if p == 2:
            r = (self.lam(i - 1) - self.lam(i)) / h
            d = (self.x0s[-2] - m_now) / r
            out = out - alpha * phi * (0.5 * d)
        return out

    def step(self, v, x):
        assert self.i < self.n
        x0 = x - self.sig[self.i] * v
        if self.i > 0:
            x = self.correct(x0, x)
        self.x0s = (self.x0s + [x0])[-self.order:]
        p = min(self.order, self.n - self.i, self.i + 1)
        self.base, self.base_order = x, p
        out = self.predict(x, p)
        self.i += 1
        return out


def synthetic_model(x, t, A, b):
    """v = A (over channels) x + b * t / 1000, float64 from float32 inputs, rounded to x's dtype
    (float32 for the reference run)."""
    xd = x.double()
    v = torch.einsum("ck,nk...->nc...", A.double(), xd) + b.double() * (float(t) / 1000.0)
    return v.to(x.dtype)


def run(config, steps, noise, A, b, dtype):
    sig, ts = flow_grid(steps, config["flow_shift"], config["num_train_timesteps"])
    s = UniPC(sig, config["solver_order"], dtype)
    x = noise.to(dtype)
    xs, vs = [x], []
    for i in range(steps):
        v = synthetic_model(x, int(ts[i]), A, b)
        x = s.step(v, x)
        assert x.dtype == dtype
        xs.append(x)
        vs.append(v)
    return sig, ts, torch.stack(xs), torch.stack(vs)


def main():
    g = torch.Generator().manual_seed(20250823)
    # A damped, slightly mixing linear field: the trajectory stays O(1) for every case.
    A = (-0.6 * torch.eye(4, dtype=torch.float64) + 0.25 * torch.randn(4, 4, generator=g, dtype=torch.float64)).float()
    b = (0.8 * torch.randn(SHAPE, generator=g, dtype=torch.float64)).float()
    noise = torch.randn(SHAPE, generator=g, dtype=torch.float64).float()
    tensors = {"model.A": A, "model.b": b, "noise": noise}
    meta = {}

    cases = []
    for shift in (3.0, 5.0):
        for steps in (1, 2, 5, 10, 50):
            cases.append((f"shift{shift:g}_steps{steps}", dict(SHIPPED, flow_shift=shift), steps))
    cases.append(("shift3_steps10_order1", dict(SHIPPED, solver_order=1), 10))
    cases.append(("shift1_steps8", dict(SHIPPED, flow_shift=1.0), 8))

    drift = 0.0
    for name, config, steps in cases:
        sig, ts, xs, vs = run(config, steps, noise, A, b, torch.float32)
        _, _, xs64, _ = run(config, steps, noise, A, b, torch.float64)
        assert torch.isfinite(xs).all(), name
        scale = max(1.0, xs.abs().max().item())
        drift = max(drift, (xs.double() - xs64).abs().max().item() / scale)
        tensors[f"{name}.sigmas"] = torch.from_numpy(sig)
        tensors[f"{name}.timesteps"] = torch.from_numpy(ts.astype(np.int32))
        tensors[f"{name}.trajectory"] = xs
        tensors[f"{name}.model_outputs"] = vs
        meta[name] = json.dumps({"steps": steps, "config": config}, sort_keys=True)
        print(f"{name}: t = {ts.tolist()[:6]}{'...' if steps > 6 else ''}, |x| <= {xs.abs().max().item():.3f}")

    grid_shifts = (1.0, 3.0, 5.0, 7.3)
    for shift in grid_shifts:
        sigs, tss = [], []
        for steps in range(1, 101):
            sig, ts = flow_grid(steps, shift)
            sigs.append(sig)
            tss.append(ts)
        tensors[f"grid.shift_{shift:g}.sigmas"] = torch.from_numpy(np.concatenate(sigs))
        tensors[f"grid.shift_{shift:g}.timesteps"] = torch.from_numpy(np.concatenate(tss).astype(np.int32))
    meta["_grid"] = json.dumps({"shifts": list(grid_shifts), "steps": [1, 100], "num_train_timesteps": 1000})
    meta["_f64_drift"] = f"{drift:.3e}"
    meta["_generator"] = GENERATOR
    meta["_description"] = ("UniPCMultistepScheduler (flow_prediction, use_flow_sigmas, bh2, predict_x0, "
                            "lower_order_final): sigmas, timesteps and trajectories of a synthetic linear model")
    print(f"float32 vs float64 trajectories: max |diff| / scale = {drift:.3e}")
    assert drift < 1e-4

    path = os.path.join(OUT_DIR, "unipc_reference.safetensors")
    write_safetensors(path, tensors, meta)
    back, back_meta = read_safetensors(path)
    for k, t in tensors.items():
        assert torch.equal(back[k], t), k
    assert back_meta == meta
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
