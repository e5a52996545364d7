"""Host<->device copy bandwidth on the GPU machine (page-locked host memory, copy streams), alone,
both directions at once, and beside f16 GEMMs on the compute stream: what activation offloading
can move while a step computes. One JSON line per measurement.
    python3 scripts/bench/pcie_bandwidth.py [--mib 512]
"""
import argparse, json, time
import torch

p = argparse.ArgumentParser()
p.add_argument("--mib", type=int, default=512)
a = p.parse_args()
n = a.mib << 20
host_out = torch.empty(n, dtype=torch.uint8, pin_memory=True)
host_in = torch.empty(n, dtype=torch.uint8, pin_memory=True)
dev_a = torch.empty(n, dtype=torch.uint8, device="cuda")
dev_b = torch.empty(n, dtype=torch.uint8, device="cuda")
d2h, h2d = torch.cuda.Stream(), torch.cuda.Stream()
x = torch.randn(8192, 5120, device="cuda", dtype=torch.float16)
w = torch.randn(5120, 5120, device="cuda", dtype=torch.float16)


def gemms(k):
    for _ in range(k):
        torch.matmul(x, w.t())


def timed(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def copy_d2h():
    with torch.cuda.stream(d2h):
        host_out.copy_(dev_a, non_blocking=True)


def copy_h2d():
    with torch.cuda.stream(h2d):
        dev_b.copy_(host_in, non_blocking=True)


gb = n / 1e9
for name, fn in [("d2h", copy_d2h), ("h2d", copy_h2d), ("both", lambda: (copy_d2h(), copy_h2d()))]:
    s = timed(fn)
    print(json.dumps({"copy": name, "GB": gb, "s": round(s, 5), "GB_per_s": round(gb / s, 1)}))
k = 40
g = timed(lambda: gemms(k))
flops = 2 * 8192 * 5120 * 5120 * k
print(json.dumps({"gemms_alone_s": round(g, 5), "TFLOPs": round(flops / g / 1e12, 1)}))
for name, fn in [("d2h", copy_d2h), ("h2d", copy_h2d), ("both", lambda: (copy_d2h(), copy_h2d()))]:
    both = timed(lambda: (fn(), gemms(k)))
    print(json.dumps({"gemms_beside": name, "s": round(both, 5), "TFLOPs": round(flops / both / 1e12, 1),
                      "slowdown": round(both / g, 3)}))
