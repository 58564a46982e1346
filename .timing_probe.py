import time, hashlib, os
from gdrprobe.protocol import handshake as hs
for bits in (12, 14, 16):
    t=time.perf_counter(); hs.solve_puzzle(bits, os.urandom(32), os.urandom(32)); print("puzzle", bits, round(time.perf_counter()-t, 2), flush=True)
t=time.perf_counter(); hs.stretch("lab-token-0123456789", b"s"*16); print("scrypt", round(time.perf_counter()-t,2), flush=True)
t=time.perf_counter()
base=hashlib.sha256(b"x")
for c in range(4096):
    h=base.copy(); h.update(c.to_bytes(8,"big")); h.digest()
print("per hash us", round((time.perf_counter()-t)/4096*1e6,1), flush=True)
