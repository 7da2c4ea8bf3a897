"""Step-cache variants of the flow-matching head at equal noise; drift is the ADE to 10 uniform Euler steps.
Usage: python stepcache.py SET N_ITEMS, SET one of
  extrap: reuse the last velocity vs extrapolate it linearly from the last two;
  grid:   cache settings (warmup, max_skip, threshold) and fewer Euler steps combined with the cache;
  x1:     reuse the predicted clean sample x1 = x + (1 - t) v instead of v (identical under Euler), fixed schedules."""
import sys, numpy as np, torch
torch.set_num_threads(1)
from mmspec.drivers import DrivingPipeline
from mmspec.drivers.train_vla import DrivingVLA, bundled_vla
from mmspec.drivers.vla import StepCache, integrate_actions, time_embedding, expert_attention_mask
from mmspec.workloads import get_workload
vla = DrivingVLA.from_pretrained(bundled_vla(), dtype=torch.float32).eval()
ex_ = vla.expert
def sample(cache, start, valid, gen, sc=None, extrap=False, num_steps=None, x1=False):
    steps = num_steps or ex_.num_steps
    B, N = 1, ex_.horizon
    x = torch.randn(B, N, 2, generator=gen)
    pos = (start[:, None] + torch.arange(N)[None]).long()
    fixed = dict(positions=pos[None].expand(3, B, N), mask=expert_attention_mask(valid, N, "sdpa", torch.float32))
    plan = sc.planner(steps) if sc else None
    hist, calls, v = [], 0, None
    for i in range(steps):
        t = torch.full((B,), i / steps)
        if plan is None or plan.compute(i):
            v = ex_.velocity(x, t, cache, start, valid, t_emb=time_embedding(t, ex_.hidden_size), **fixed)
            calls += 1
            hist.append((i, v, x + (1 - i / steps) * v))
            if plan is not None: plan.observe(i, v)
            use = v
        else:
            (i1, v1, x1h) = hist[-1]
            if x1:
                use = (x1h - x) / (1 - i / steps)
            elif extrap and len(hist) > 1:
                (i0, v0, _) = hist[-2]
                use = v1 + (i - i1) * (v1 - v0) / (i1 - i0)
            else:
                use = v1
        x = x + use / steps
    return x * ex_.action_scale + ex_.action_mean, calls
pipe = DrivingPipeline(vla, flashdrive="system")


def variant_set(name):
    out = [("uniform 10", {})]
    if name == "extrap":
        for t in (0.1, 0.2, 0.3, 0.5):
            out += [(f"adaptive {t} reuse", dict(sc=StepCache("adaptive", t))),
                    (f"adaptive {t} extrap", dict(sc=StepCache("adaptive", t), extrap=True))]
        for ms in (3, 4):
            for t in (0.2, 0.3, 0.5):
                out += [(f"adaptive {t} extrap maxskip{ms}", dict(sc=StepCache("adaptive", t, max_skip=ms), extrap=True))]
        out += [("fixed 3456 reuse", dict(sc=StepCache("fixed"))),
                ("fixed 3456 extrap", dict(sc=StepCache("fixed"), extrap=True)),
                ("fixed 3578 extrap", dict(sc=StepCache("fixed", cache_steps=(3, 5, 7, 8)), extrap=True))]
        return out + [(f"uniform {n}", dict(num_steps=n)) for n in (7, 6, 5, 4)]
    if name == "grid":
        out += [("adaptive 0.1 (now)", dict(sc=StepCache("adaptive", 0.1)))]
        for w in (1, 2):
            for ms in (3, 5):
                for t in (0.1, 0.15):
                    out += [(f"adaptive {t} warmup{w} maxskip{ms}", dict(sc=StepCache("adaptive", t, warmup=w, max_skip=ms)))]
        for n in (8, 7, 6):
            for t in (0.05, 0.1):
                out += [(f"steps {n} adaptive {t}", dict(sc=StepCache("adaptive", t), num_steps=n))]
        return out + [(f"uniform {n}", dict(num_steps=n)) for n in (8, 7, 6, 5)]
    if name == "x1":
        for t in (0.1, 0.15, 0.2, 0.3):
            out += [(f"adaptive {t} reuse v", dict(sc=StepCache("adaptive", t))),
                    (f"adaptive {t} reuse x1", dict(sc=StepCache("adaptive", t), x1=True))]
        out += [(f"adaptive {t} x1 maxskip5", dict(sc=StepCache("adaptive", t, max_skip=5), x1=True)) for t in (0.3, 0.5)]
        out += [("fixed 3456 reuse v", dict(sc=StepCache("fixed"))), ("fixed 3456 reuse x1", dict(sc=StepCache("fixed"), x1=True))]
        out += [(f"fixed {a}-{b} x1", dict(sc=StepCache("fixed", cache_steps=tuple(range(a, b + 1))), x1=True))
                for a, b in ((2, 7), (2, 8), (1, 8))]
        return out + [(f"uniform {n}", dict(num_steps=n)) for n in (6, 5, 4, 3, 2)]
    raise SystemExit(f"SET must be extrap, grid or x1, got {name!r}")


variants = variant_set(sys.argv[1])
acc = {n: {"calls": [], "drift": [], "ade": []} for n, _ in variants}
exs = get_workload("driving").examples("test", int(sys.argv[2]))
for i, ex in enumerate(exs):
    pipe.step(ex.images, ex.meta["history"], ex.meta["speed"], seed=i)
    cache, start, valid = pipe.engine.last_context
    ref = None
    with torch.no_grad():
        for name, kw in variants:
            a, c = sample(cache, start, valid, torch.Generator().manual_seed(i), **kw)
            traj = integrate_actions(a.float().numpy(), [ex.meta["speed"]])[0]
            ref = traj if ref is None else ref
            acc[name]["calls"].append(c)
            acc[name]["drift"].append(float(np.linalg.norm(traj - ref, axis=-1).mean()))
            acc[name]["ade"].append(float(np.linalg.norm(traj - ex.meta["future"], axis=-1).mean()))
    print(i, flush=True, file=sys.stderr)
for name, _ in variants:
    d = acc[name]
    print(f"{name:34s} calls {np.mean(d['calls']):.2f} drift {np.mean(d['drift']):.3f} (median {np.median(d['drift']):.3f}) ade {np.mean(d['ade']):.3f}")
