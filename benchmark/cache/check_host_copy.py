"""Device check of the host tier copier: async write-back on a side stream, slot reuse right after eviction, explicit sync before load. Prints OK or MISMATCH."""
import torch
from sglang_hybrid.mem_cache.host_copy import HostCopier
dev = "cuda" if torch.cuda.is_available() else "cpu"
c = HostCopier(torch.device(dev))
kv = [torch.randn(1000, 1, 576, device=dev) for _ in range(3)]
st = [torch.randn(4, 50, 8, 3, device=dev), torch.randn(4, 50, 16, 16, device=dev)]
idx = torch.tensor([5, 7, 9, 100], device=dev)
ref = [b[idx].clone() for b in kv]
cp = c.save(kv, idx, dim=0)
for b in kv: b[idx] = 0  # the freed slots are reused right after eviction
sref = [b[:, 3].clone() for b in st]
sc = c.save(st, torch.tensor([3], device=dev), dim=1)
for b in st: b[:, 3] = -1
new = torch.tensor([1, 2, 3, 4], device=dev)
c.load(cp, kv, new)
c.load(sc, st, torch.tensor([40], device=dev))
ok = all(torch.equal(b[new], r) for b, r in zip(kv, ref)) and all(torch.equal(b[:, 40], r) for b, r in zip(st, sref))
print(dev, "async" if c.is_async else "sync", "OK" if ok else "MISMATCH")
