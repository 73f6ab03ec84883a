"""A CPU check of the windows kernel's algorithm, not of the kernel itself (built in session 45 as
docs/patches/s45_windows_scan_prep_branch.patch, landed in 31458a2 after its GPU tests in session 46:
bwd_chain_windows_kernel in cuda/src/bwd/bwd_state_grad_segments.cuh):
its algorithm (a block of 256 threads: the shuffle scan of the affine maps (gamma, L) over a tile,
the pass over the 8 warps' totals, the highest failing chunk, one thread a boundary) emulated in
numpy float32 beside the landed serial walk (bwd_chain_windows_kernel at 33ba0d8) on random
sequences: 1-1300 chunks, segments of 8-128, decay weak to strong, some chunks failing the
beta |k^|^2 bounds. Both give the same window for every segment and the same verdict (300 of 300
cases, session 45). Run: /usr/bin/python3 docs/patches/s45_windows_scan_emulation.py"""
import numpy as np, random
f32=np.float32
T=256; RING=512
def serial(g,L,ok,bT,seg,wmax,nch):
    win={}; b=f32(bT); suffix_ok=True; ring_b={}; ring_g={}; cert=True
    for cc in range(nch-1,-1,-1):
        suffix_ok = suffix_ok and ok[cc]
        b = f32(g[cc]*b+L[cc]) if suffix_ok else f32(np.inf)
        ring_b[cc]=b; ring_g[cc]=g[cc]
        if cc % seg or cc==0: continue
        e=-1; decay=f32(1)
        for ee in range(cc+1, min(cc+wmax,nch)+1):
            decay=f32(decay*ring_g[ee-1])
            if ee==nch or (suffix_ok and f32(decay*ring_b[ee]) <= f32(2**-24)*b): e=ee; break
        win[cc-seg]=e; cert = cert and e>0
    win[((nch-1)//seg)*seg]=nch
    return win,cert
def parallel(g,L,ok,bT,seg,wmax,nch):
    win={}; b_top=f32(bT); bad_hi=-1; ring_b=[None]*RING; ring_g=[None]*RING; cert=[True]*T
    top=nch
    while top>0:
        cs=[top-1-t for t in range(T)]
        gam=[f32(g[c]) if c>=0 else f32(1) for c in cs]; ell=[f32(L[c]) if c>=0 else f32(0) for c in cs]
        for c in cs:
            if c>=0 and not ok[c]: bad_hi=max(bad_hi,c)
        a=list(gam); bb=list(ell)
        for w in range(T//32):  # warp scan
            off=1
            while off<32:
                pa=[a[w*32+l-off] if l>=off else None for l in range(32)]
                pb=[bb[w*32+l-off] if l>=off else None for l in range(32)]
                for l in range(off,32):
                    i=w*32+l; bb[i]=f32(a[i]*pb[l]+bb[i]); a[i]=f32(a[i]*pa[l])
                off*=2
        wa=[a[w*32+31] for w in range(T//32)]; wb=[bb[w*32+31] for w in range(T//32)]
        ma=[];mb=[]
        for t in range(T):
            w=t//32; ca=f32(1); cb=f32(0)
            for ww in range(w): cb=f32(wa[ww]*cb+wb[ww]); ca=f32(ca*wa[ww])
            ma.append(f32(a[t]*ca)); mb.append(f32(a[t]*cb+bb[t]))
        bt=b_top; B=[]
        for t,c in enumerate(cs):
            so = c>bad_hi
            with np.errstate(all='ignore'):
                B.append(f32(ma[t]*bt+mb[t]) if so else f32(np.inf))
            if c>=0: ring_b[c&(RING-1)]=B[t]; ring_g[c&(RING-1)]=gam[t]
        if cs[T-1]>=0: b_top=B[T-1]
        for t,c in enumerate(cs):
            if c>0 and c%seg==0:
                so=c>bad_hi; e=-1; decay=f32(1)
                for ee in range(c+1,min(c+wmax,nch)+1):
                    decay=f32(decay*ring_g[(ee-1)&(RING-1)])
                    if ee==nch or (so and f32(decay*ring_b[ee&(RING-1)])<=f32(2**-24)*B[t]): e=ee;break
                win[c-seg]=e; cert[t]=cert[t] and e>0
        top-=T
    win[((nch-1)//seg)*seg]=nch
    return win, all(cert)
rng=np.random.default_rng(1); diff=0; n=0
for trial in range(300):
    nch=int(rng.integers(1,1300)); seg=int(2**rng.integers(3,8)); wmax=2*seg
    mode=rng.integers(0,4)
    g=np.exp(-rng.uniform(0,[0.05,3,8,0.3][mode],nch)).astype(f32)
    L=rng.uniform(0,5,nch).astype(f32)
    ok=rng.uniform(size=nch) > ([0,0,0.001,0.0][mode])
    bT=f32(rng.uniform(0,10))
    s=serial(g,L,ok,bT,seg,wmax,nch); p=parallel(g,L,ok,bT,seg,wmax,nch)
    n+=1
    if s!=p:
        diff+=1
        d=[(k,s[0].get(k),p[0].get(k)) for k in set(s[0])|set(p[0]) if s[0].get(k)!=p[0].get(k)]
        print('trial',trial,'nch',nch,'seg',seg,'mode',mode,'cert',s[1],p[1],'diffs',d[:5])
print('trials',n,'differing',diff)
