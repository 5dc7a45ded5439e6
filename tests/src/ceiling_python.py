"""The kernel's ceiling for forked runs, made by a CPython interpreter: the same steps as the bench's
Rust ceiling (a cgroup per run in each v1 hierarchy, a clone with the run's namespaces, private
mounts, a tmpfs scratch with five directories, binds on /dev/shm and /tmp, a fresh /proc, exit),
but each child is a fork of this interpreter, its heap frozen as a template's is, 16 in flight from
one thread as a template forks them. What it adds over the Rust ceiling is what forking an
interpreter costs (page tables, copy-on-write, the exit's unmap) with no run's work at all.

argv[1]: JSON {"flags", "cgroups": [[controller, dir]], "scratch", "runs", "uid_map", "gid_map"}.
Prints JSON {"runs_per_s", "rss_mib"}."""
import ctypes, gc, json, os, sys, time
import resource, select, signal, socket  # what a template holds besides the runner

cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
SYS_CLONE = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
SIGCHLD = 17
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
flags, scratch = cfg["flags"], cfg["scratch"]
userns = bool(flags & 0x10000000)
subdirs = [os.path.join(scratch, d).encode() for d in ("work", "tmp", "shm", "home", "out")]
limits = {"memory": ("memory.limit_in_bytes", "1073741824"), "pids": ("pids.max", "264")}
gc.freeze()


def child(joins):
    for fd in joins:
        if os.write(fd, b"0") != 1:
            return 1
    if userns:
        for name, text in (("setgroups", "deny"), ("uid_map", cfg["uid_map"]), ("gid_map", cfg["gid_map"])):
            with open("/proc/self/" + name, "w") as f:
                f.write(text)
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None):
        return 3
    if libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0700,size=67108864"):
        return 4
    for d in subdirs:
        os.mkdir(d, 0o700)
    if libc.mount(subdirs[2], b"/dev/shm", None, MS_BIND | MS_REC, None):
        return 6
    if libc.mount(subdirs[1], b"/tmp", None, MS_BIND | MS_REC, None):
        return 6
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None):
        return 7
    return 0


def start(n):
    dirs, joins = [], []
    for controller, parent in cfg["cgroups"]:
        d = os.path.join(parent, "runpython-pyceiling-%d-%d" % (os.getpid(), n))
        os.mkdir(d)
        dirs.append(d)
        name, value = limits[controller]
        with open(os.path.join(d, name), "w") as f:
            f.write(value)
        joins.append(os.open(os.path.join(d, "tasks"), os.O_WRONLY))
    pid = libc.syscall(SYS_CLONE, ctypes.c_long(flags | SIGCHLD), 0, 0, 0, 0)
    if pid == 0:
        try:
            code = child(joins)
        except BaseException:
            code = 9
        os._exit(code)
    for fd in joins:
        os.close(fd)
    if pid < 0:
        raise OSError(ctypes.get_errno(), "clone with the run's namespaces")
    return pid, dirs


def remove(dirs):
    for d in dirs:
        for _ in range(100):
            try:
                os.rmdir(d)
                break
            except OSError as e:
                if e.errno != 16:  # EBUSY: a v1 group a moment after its task left
                    raise
                time.sleep(0.001)


def burst(runs):
    live, n, t = {}, 0, time.perf_counter()
    while n < runs or live:
        while len(live) < 16 and n < runs:
            pid, dirs = start(n)
            live[pid] = dirs
            n += 1
        pid, status = os.wait()
        if status != 0:
            raise SystemExit(
                "a ceiling child failed: wait status %d (exit 1: cgroup join, 3: private mounts, "
                "4: tmpfs, 6: binds, 7: /proc, 9: an exception)" % status
            )
        remove(live.pop(pid))
    return runs / (time.perf_counter() - t)


burst(32)
rate = burst(cfg["runs"])
with open("/proc/self/status") as f:
    rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024
print(json.dumps({"runs_per_s": rate, "rss_mib": rss}))
