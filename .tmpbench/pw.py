import os, mmap, time, threading, statistics, subprocess, sys
SIZE=16<<20; FRAME=2300
def zf(path):
    fd=os.open(path,os.O_RDWR|os.O_CREAT|os.O_TRUNC,0o644)
    z=bytes(65536)
    for i in range(SIZE//65536): os.write(fd,z)
    os.fsync(fd); return fd
data=os.urandom(FRAME)
def syncer(fd, stop):
    while not stop.is_set(): os.fdatasync(fd)
for mode in ("pwrite","mmap","pwrite","mmap"):
    fd=zf(f"f-{mode}")
    stop=threading.Event()
    # syncer in a separate process to avoid GIL: use a child running fdatasync loop
    child=subprocess.Popen([sys.executable,"-c",f"""
import os,sys,time
fd=os.open('f-{mode}',os.O_WRONLY)
t=time.time()
while time.time()-t<3: os.fdatasync(fd)
"""])
    time.sleep(0.1)
    ts=[]; off=0
    if mode=="mmap":
        m=mmap.mmap(fd,SIZE,flags=mmap.MAP_SHARED|getattr(mmap,'MAP_POPULATE',0))
        mv=memoryview(m)
    t0=time.perf_counter()
    n=0
    while off+FRAME<SIZE and time.perf_counter()-t0<2:
        t=time.perf_counter_ns()
        if mode=="pwrite": os.pwrite(fd,data,off)
        else: mv[off:off+FRAME]=data
        ts.append(time.perf_counter_ns()-t); off+=FRAME; n+=1
        # simulate loop work between frames
        x=0
        for i in range(300): x+=i
    child.wait()
    print(mode, n, "p50 us", statistics.median(ts)/1000, "mean us", statistics.mean(ts)/1000, "p90", sorted(ts)[int(n*.9)]/1000)
    if mode=="mmap": mv.release(); m.close()
    os.close(fd)
