//! The connect notifier's program: classic BPF, assembled here with named jump targets and checked by
//! a small interpreter in its tests.
//!
//! Two forms. Without the guard (the host relays every connection, so no socket of the host's
//! namespace ever reaches the run): every native `connect(2)` becomes a notification. With the guard
//! (Landlock refuses the run's own TCP `bind(2)` and `connect(2)`, so the host may hand the run a
//! socket it connected in its own namespace), it also makes `bind(2)`, `listen(2)` and the network
//! device and ARP `ioctl(2)`s notifications, which the host performs on the very socket it inspected,
//! never by letting the kernel continue: a socket of the host's can then do nothing but carry the
//! connection the host made. For that it refuses what would move such a socket's packets elsewhere or
//! reach its namespace behind the host's back: TCP Fast Open (a connect inside `sendto`/`sendmsg`),
//! the IP options and IPv6 headers that source-route (`IP_OPTIONS`, routing headers), binding to a
//! device, upper-layer protocols (`TCP_ULP`), and io_uring (whose own connect, bind and listen
//! bypass every filter). Both forms kill a process of any other architecture (an i386 `int 0x80` is
//! one) and refuse x32's numbers with `ENOSYS`.

/// One instruction as the kernel reads it.
type Insn = libc::sock_filter;

/// Where a jump goes.
#[derive(Clone, Copy)]
enum To {
    Next,
    Label(&'static str),
}

/// An assembler of one program: instructions with named jump targets, resolved at the end.
#[derive(Default)]
struct Asm {
    code: Vec<(u16, To, To, u32)>,
    labels: Vec<(&'static str, usize)>,
}

impl Asm {
    fn label(&mut self, name: &'static str) -> &mut Self {
        self.labels.push((name, self.code.len()));
        self
    }

    /// Loads the 32 bits of `seccomp_data` at `offset`.
    fn load(&mut self, offset: u32) -> &mut Self {
        self.code.push((
            (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            To::Next,
            To::Next,
            offset,
        ));
        self
    }

    /// Loads the low 32 bits of the system call's argument `n` (the kernel reads an `int`, a flag
    /// word or an `ioctl` command as those bits).
    fn arg(&mut self, n: u32) -> &mut Self {
        #[cfg(target_endian = "little")]
        return self.load(16 + 8 * n);
        #[cfg(target_endian = "big")]
        return self.load(20 + 8 * n);
    }

    fn jump(&mut self, op: u32, k: u32, yes: To, no: To) -> &mut Self {
        self.code
            .push(((libc::BPF_JMP | op | libc::BPF_K) as u16, yes, no, k));
        self
    }

    /// Goes to `to` when the accumulator is `k`.
    fn eq(&mut self, k: u32, to: &'static str) -> &mut Self {
        self.jump(libc::BPF_JEQ, k, To::Label(to), To::Next)
    }

    fn ret(&mut self, action: u32) -> &mut Self {
        self.code.push((
            (libc::BPF_RET | libc::BPF_K) as u16,
            To::Next,
            To::Next,
            action,
        ));
        self
    }

    fn finish(&self) -> Vec<Insn> {
        let resolve = |at: usize, to: To| -> u8 {
            let target = match to {
                To::Next => at + 1,
                To::Label(name) => {
                    self.labels
                        .iter()
                        .find(|(n, _)| *n == name)
                        .unwrap_or_else(|| panic!("the notifier's program has no label {name}"))
                        .1
                }
            };
            // Classic BPF jumps only forward, at most 255 instructions.
            u8::try_from(target - (at + 1)).expect("a jump in the notifier's program is too long")
        };
        self.code
            .iter()
            .enumerate()
            .map(|(at, &(code, yes, no, k))| Insn {
                code,
                jt: resolve(at, yes),
                jf: resolve(at, no),
                k,
            })
            .collect()
    }
}

// linux/audit.h: EM_X86_64 and EM_AARCH64, 64-bit, little-endian.
#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const ARCH: u32 = 0xc000_00b7;
// x86-64's x32 ABI reaches every call with bit 30 set in the number; elsewhere nothing is that high.
#[cfg(target_arch = "x86_64")]
const X32: u32 = 0x4000_0000;
#[cfg(not(target_arch = "x86_64"))]
const X32: u32 = 0x7fff_ffff;

/// The socket `ioctl`s the guard hands to the host: routes, network devices, ARP and the rest of
/// `0x89xx` above the per-socket ones (`SIOCATMARK`, `SIOCGSTAMP` and the like, below it).
pub(crate) const DEVICE_IOCTLS: std::ops::RangeInclusive<u32> = 0x890B..=0x89FF;

/// Socket options the guard refuses, by level: each moves packets elsewhere than to the connected
/// destination (source routing, another device) or hands the socket to other kernel code.
const REFUSED_OPTIONS: [(u32, &[u32]); 4] = [
    (
        libc::SOL_IP as u32,
        &[
            libc::IP_OPTIONS as u32,
            7, // IP_RETOPTS
            libc::IP_UNICAST_IF as u32,
        ],
    ),
    (
        libc::SOL_IPV6 as u32,
        &[
            3, // IPV6_2292HOPOPTS
            4, // IPV6_2292DSTOPTS
            5, // IPV6_2292RTHDR
            6, // IPV6_2292PKTOPTIONS
            9, // IPV6_NEXTHOP
            libc::IPV6_PKTINFO as u32,
            libc::IPV6_HOPOPTS as u32,
            55, // IPV6_RTHDRDSTOPTS
            libc::IPV6_RTHDR as u32,
            libc::IPV6_DSTOPTS as u32,
            libc::IPV6_UNICAST_IF as u32,
        ],
    ),
    (
        libc::SOL_SOCKET as u32,
        &[libc::SO_BINDTODEVICE as u32, 62 /* SO_BINDTOIFINDEX */],
    ),
    (libc::SOL_TCP as u32, &[libc::TCP_ULP as u32]),
];

fn errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | e as u32
}

/// The program, guarded or not (see the module's documentation), assembled once per process: the
/// host takes it before it forks, and the child installs it without allocating.
pub(crate) fn program(guarded: bool) -> &'static [Insn] {
    static PROGRAMS: [std::sync::OnceLock<Vec<Insn>>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    PROGRAMS[usize::from(guarded)].get_or_init(|| assemble(guarded))
}

fn assemble(guarded: bool) -> Vec<Insn> {
    let nr = |n: libc::c_long| n as u32;
    let mut a = Asm::default();
    a.load(4)
        .jump(libc::BPF_JEQ, ARCH, To::Next, To::Label("kill"))
        .load(0)
        .jump(libc::BPF_JGE, X32, To::Label("enosys"), To::Next)
        .eq(nr(libc::SYS_connect), "notify");
    if guarded {
        a.eq(nr(libc::SYS_bind), "notify")
            .eq(nr(libc::SYS_listen), "notify")
            .eq(nr(libc::SYS_io_uring_setup), "eperm")
            .eq(nr(libc::SYS_io_uring_enter), "eperm")
            .eq(nr(libc::SYS_io_uring_register), "eperm")
            .eq(nr(libc::SYS_sendto), "flags3")
            .eq(nr(libc::SYS_sendmmsg), "flags3")
            .eq(nr(libc::SYS_sendmsg), "flags2")
            .eq(nr(libc::SYS_setsockopt), "sockopt")
            .eq(nr(libc::SYS_ioctl), "ioctl");
    }
    a.ret(libc::SECCOMP_RET_ALLOW);
    if guarded {
        let fast_open = libc::MSG_FASTOPEN as u32;
        a.label("flags3")
            .arg(3)
            .jump(libc::BPF_JSET, fast_open, To::Label("fastopen"), To::Next)
            .ret(libc::SECCOMP_RET_ALLOW)
            .label("flags2")
            .arg(2)
            .jump(libc::BPF_JSET, fast_open, To::Label("fastopen"), To::Next)
            .ret(libc::SECCOMP_RET_ALLOW)
            .label("fastopen")
            .ret(errno(libc::EOPNOTSUPP));
        a.label("sockopt").arg(1);
        const LEVELS: [&str; 4] = ["level0", "level1", "level2", "level3"];
        for ((level, _), label) in REFUSED_OPTIONS.iter().zip(LEVELS) {
            a.eq(*level, label);
        }
        a.ret(libc::SECCOMP_RET_ALLOW);
        for ((_, names), label) in REFUSED_OPTIONS.iter().zip(LEVELS) {
            a.label(label).arg(2);
            for name in *names {
                a.eq(*name, "eperm");
            }
            a.ret(libc::SECCOMP_RET_ALLOW);
        }
        a.label("ioctl")
            .arg(1)
            .jump(
                libc::BPF_JGE,
                *DEVICE_IOCTLS.start(),
                To::Next,
                To::Label("allow"),
            )
            .jump(
                libc::BPF_JGT,
                *DEVICE_IOCTLS.end(),
                To::Label("allow"),
                To::Label("notify"),
            )
            .label("eperm")
            .ret(errno(libc::EPERM));
    }
    a.label("notify")
        .ret(libc::SECCOMP_RET_USER_NOTIF)
        .label("allow")
        .ret(libc::SECCOMP_RET_ALLOW)
        .label("enosys")
        .ret(errno(libc::ENOSYS))
        .label("kill")
        .ret(libc::SECCOMP_RET_KILL_PROCESS);
    a.finish()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// What the kernel would answer for a call, by running the program on its `seccomp_data`.
    fn run(program: &[Insn], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::with_capacity(64);
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for arg in args {
            data.extend_from_slice(&arg.to_ne_bytes());
        }
        let word = |offset: u32| {
            let o = offset as usize;
            u32::from_ne_bytes(data[o..o + 4].try_into().unwrap())
        };
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let insn = program[pc];
            let code = u32::from(insn.code);
            match code & 0x07 {
                libc::BPF_LD => acc = word(insn.k),
                libc::BPF_RET => return insn.k,
                libc::BPF_JMP => {
                    let taken = match code & 0xf0 {
                        libc::BPF_JEQ => acc == insn.k,
                        libc::BPF_JGE => acc >= insn.k,
                        libc::BPF_JGT => acc > insn.k,
                        libc::BPF_JSET => acc & insn.k != 0,
                        other => panic!("unexpected jump {other:#x}"),
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                other => panic!("unexpected class {other:#x}"),
            }
            pc += 1;
        }
    }

    fn call(program: &[Insn], nr: libc::c_long, args: [u64; 6]) -> u32 {
        run(program, ARCH, nr as u32, args)
    }

    const NOTIFY: u32 = libc::SECCOMP_RET_USER_NOTIF;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

    #[test]
    fn unguarded_only_connect_reaches_the_host() {
        let p = assemble(false);
        assert_eq!(call(&p, libc::SYS_connect, [3, 0, 16, 0, 0, 0]), NOTIFY);
        for nr in [
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_sendto,
            libc::SYS_ioctl,
        ] {
            assert_eq!(call(&p, nr, [3, 0x8912, 0, 0, 0, 0]), ALLOW, "{nr}");
        }
        assert_eq!(
            call(&p, libc::SYS_connect | 0x4000_0000, [0; 6]),
            errno(libc::ENOSYS)
        );
        assert_eq!(
            run(&p, 0x4000_0003, 102, [0; 6]), // an i386 socketcall
            libc::SECCOMP_RET_KILL_PROCESS
        );
    }

    #[test]
    fn guarded_the_host_performs_bind_listen_connect_and_device_ioctls() {
        let p = assemble(true);
        for nr in [libc::SYS_connect, libc::SYS_bind, libc::SYS_listen] {
            assert_eq!(call(&p, nr, [3, 0, 16, 0, 0, 0]), NOTIFY, "{nr}");
        }
        for cmd in [
            0x890Bu64,
            0x8912,
            0x8915,
            0x8933,
            0x8954,
            0x89FF,
            0xdead_0000_8912,
        ] {
            assert_eq!(
                call(&p, libc::SYS_ioctl, [3, cmd, 0, 0, 0, 0]),
                NOTIFY,
                "{cmd:#x}"
            );
        }
        // Per-socket ioctls (SIOCATMARK, SIOCGSTAMP, FIONREAD) and terminals' stay the kernel's.
        for cmd in [0x8905u64, 0x8906, 0x541B, 0x5401, 0x8A00] {
            assert_eq!(
                call(&p, libc::SYS_ioctl, [3, cmd, 0, 0, 0, 0]),
                ALLOW,
                "{cmd:#x}"
            );
        }
        assert_eq!(
            run(&p, 0x4000_0003, 102, [0; 6]),
            libc::SECCOMP_RET_KILL_PROCESS
        );
        assert_eq!(
            call(&p, libc::SYS_bind | 0x4000_0000, [0; 6]),
            errno(libc::ENOSYS)
        );
    }

    #[test]
    fn guarded_fast_open_routing_options_and_io_uring_are_refused() {
        let p = assemble(true);
        let fast = libc::MSG_FASTOPEN as u64;
        assert_eq!(
            call(&p, libc::SYS_sendto, [3, 0, 1, fast | 0x40, 0, 0]),
            errno(libc::EOPNOTSUPP)
        );
        assert_eq!(
            call(&p, libc::SYS_sendmsg, [3, 0, fast, 0, 0, 0]),
            errno(libc::EOPNOTSUPP)
        );
        assert_eq!(
            call(&p, libc::SYS_sendmmsg, [3, 0, 1, fast, 0, 0]),
            errno(libc::EOPNOTSUPP)
        );
        assert_eq!(call(&p, libc::SYS_sendto, [3, 0, 1, 0x40, 0, 0]), ALLOW);
        assert_eq!(call(&p, libc::SYS_sendmsg, [3, 0, 0x4000, 0, 0, 0]), ALLOW);
        for (level, names) in REFUSED_OPTIONS {
            for name in names {
                let args = [3, u64::from(level), u64::from(*name), 0, 4, 0];
                assert_eq!(
                    call(&p, libc::SYS_setsockopt, args),
                    errno(libc::EPERM),
                    "{level}/{name}"
                );
            }
        }
        for (level, name) in [
            (libc::SOL_TCP, libc::TCP_NODELAY),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
            (libc::SOL_IP, libc::IP_TOS),
            (libc::SOL_IPV6, libc::IPV6_V6ONLY),
            (libc::SOL_IPV6, libc::IP_OPTIONS), // 4 at another level than IPv4's
        ] {
            let args = [3, level as u64, name as u64, 0, 4, 0];
            if (level, name) == (libc::SOL_IPV6, libc::IP_OPTIONS) {
                // IPV6_2292DSTOPTS is 4 too: refused.
                assert_eq!(call(&p, libc::SYS_setsockopt, args), errno(libc::EPERM));
            } else {
                assert_eq!(
                    call(&p, libc::SYS_setsockopt, args),
                    ALLOW,
                    "{level}/{name}"
                );
            }
        }
        for nr in [
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
        ] {
            assert_eq!(call(&p, nr, [0; 6]), errno(libc::EPERM));
        }
        assert_eq!(call(&p, libc::SYS_read, [0; 6]), ALLOW);
    }
}
