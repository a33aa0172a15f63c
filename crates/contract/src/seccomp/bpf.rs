//! The compiler from a [`SeccompPolicy`] to a classic BPF program for x86-64, and the
//! program's identity (the sha256 the plan as enforced names).

use super::syscalls::X86_64_SYSCALLS;
use super::{ArgCondition, ArgOp, SeccompAction, SeccompPolicy, SyscallPolicy, ENOSYS};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// One instruction of a classic BPF program, laid out as the kernel's `struct
/// sock_filter` (linux/filter.h): the runtime turns it into one field for field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BpfInsn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

impl BpfInsn {
    pub const fn new(code: u16, jt: u8, jf: u8, k: u32) -> BpfInsn {
        BpfInsn { code, jt, jf, k }
    }

    /// The instruction's 8 bytes as the kernel reads them (little-endian x86-64).
    pub fn to_bytes(self) -> [u8; 8] {
        let mut bytes = [0u8; 8];
        bytes[..2].copy_from_slice(&self.code.to_le_bytes());
        bytes[2] = self.jt;
        bytes[3] = self.jf;
        bytes[4..].copy_from_slice(&self.k.to_le_bytes());
        bytes
    }
}

/// sha256 (hex) of a program's bytes as handed to `seccomp(2)`: the filter's identity in
/// the plan as enforced, and what the runtime checks the program it installs against.
pub fn program_sha256(program: &[BpfInsn]) -> String {
    let mut hash = Sha256::new();
    for insn in program {
        hash.update(insn.to_bytes());
    }
    hex::encode(hash.finalize())
}

/// The kernel's return value for `action`.
fn return_value(action: SeccompAction) -> u32 {
    match action {
        SeccompAction::Allow => SECCOMP_RET_ALLOW,
        SeccompAction::Errno(errno) => SECCOMP_RET_ERRNO | u32::from(errno),
        SeccompAction::KillProcess => SECCOMP_RET_KILL_PROCESS,
    }
}

// Classic BPF encoding (linux/filter.h, linux/seccomp.h).
pub(crate) const BPF_LD_W_ABS: u16 = 0x20;
pub(crate) const BPF_JMP_JA: u16 = 0x05;
pub(crate) const BPF_JMP_JEQ_K: u16 = 0x15;
pub(crate) const BPF_JMP_JGT_K: u16 = 0x25;
pub(crate) const BPF_JMP_JGE_K: u16 = 0x35;
pub(crate) const BPF_ALU_AND_K: u16 = 0x54;
pub(crate) const BPF_RET_K: u16 = 0x06;
pub(crate) const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
pub(crate) const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
pub(crate) const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
pub(crate) const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
const fn offset_arg_low(index: u8) -> u32 {
    16 + 8 * index as u32
}
const BPF_MAXINSNS: usize = 4096;

/// An instruction whose jump target may still be symbolic.
#[derive(Clone, Copy)]
enum Insn {
    Stmt {
        code: u16,
        k: u32,
    },
    /// Conditional jump with small relative offsets (always local).
    Jump {
        code: u16,
        k: u32,
        jt: u8,
        jf: u8,
    },
    /// Unconditional jump to a label (32-bit offset, so any distance).
    JumpTo(usize),
    Label(usize),
}

struct Emitter {
    insns: Vec<Insn>,
    next_label: usize,
}

impl Emitter {
    fn label(&mut self) -> usize {
        self.next_label += 1;
        self.next_label
    }
    fn stmt(&mut self, code: u16, k: u32) {
        self.insns.push(Insn::Stmt { code, k });
    }
    fn jump(&mut self, code: u16, k: u32, jt: u8, jf: u8) {
        self.insns.push(Insn::Jump { code, k, jt, jf });
    }
    fn ret(&mut self, action: SeccompAction) {
        self.stmt(BPF_RET_K, return_value(action));
    }
    /// Continues when `A <code> k` holds, else jumps to `fail`.
    fn require(&mut self, code: u16, k: u32, fail: usize) {
        self.jump(code, k, 1, 0);
        self.insns.push(Insn::JumpTo(fail));
    }
    /// Continues when `A <code> k` does NOT hold, else jumps to `target`.
    fn branch_if(&mut self, code: u16, k: u32, target: usize) {
        self.jump(code, k, 0, 1);
        self.insns.push(Insn::JumpTo(target));
    }

    fn finish(self) -> Result<Vec<BpfInsn>, String> {
        let mut positions = BTreeMap::new();
        let mut pc = 0usize;
        for insn in &self.insns {
            match insn {
                Insn::Label(id) => {
                    positions.insert(*id, pc);
                }
                _ => pc += 1,
            }
        }
        if pc > BPF_MAXINSNS {
            return Err(format!(
                "the filter is too large ({pc} instructions, the kernel allows {BPF_MAXINSNS})"
            ));
        }
        let mut out = Vec::with_capacity(pc);
        for insn in &self.insns {
            let filter = match *insn {
                Insn::Label(_) => continue,
                Insn::Stmt { code, k } => BpfInsn {
                    code,
                    jt: 0,
                    jf: 0,
                    k,
                },
                Insn::Jump { code, k, jt, jf } => BpfInsn { code, jt, jf, k },
                Insn::JumpTo(label) => {
                    let target = positions[&label];
                    let offset = target - (out.len() + 1);
                    BpfInsn::new(BPF_JMP_JA, 0, 0, offset as u32)
                }
            };
            out.push(filter);
        }
        Ok(out)
    }
}

/// Emits the check of one argument condition; jumps to `fail` when it does not hold.
/// 64-bit comparisons are done on the high word first, then the low word.
fn emit_condition(e: &mut Emitter, c: &ArgCondition, fail: usize) {
    let low = offset_arg_low(c.index);
    let high = low + 4;
    let (v_hi, v_lo) = ((c.value >> 32) as u32, c.value as u32);
    match c.op {
        ArgOp::Eq | ArgOp::MaskedEq(_) => {
            let mask = if let ArgOp::MaskedEq(m) = c.op {
                m
            } else {
                u64::MAX
            };
            let (m_hi, m_lo) = ((mask >> 32) as u32, mask as u32);
            if !c.width32 {
                e.stmt(BPF_LD_W_ABS, high);
                if m_hi != u32::MAX {
                    e.stmt(BPF_ALU_AND_K, m_hi);
                }
                e.require(BPF_JMP_JEQ_K, v_hi & m_hi, fail);
            }
            e.stmt(BPF_LD_W_ABS, low);
            if m_lo != u32::MAX {
                e.stmt(BPF_ALU_AND_K, m_lo);
            }
            e.require(BPF_JMP_JEQ_K, v_lo & m_lo, fail);
        }
        ArgOp::Ne => {
            // Holds unless both words are equal.
            let holds = e.label();
            if !c.width32 {
                e.stmt(BPF_LD_W_ABS, high);
                // Different high words: the values differ, the condition holds.
                e.jump(BPF_JMP_JEQ_K, v_hi, 1, 0);
                e.insns.push(Insn::JumpTo(holds));
            }
            e.stmt(BPF_LD_W_ABS, low);
            e.branch_if(BPF_JMP_JEQ_K, v_lo, fail);
            e.insns.push(Insn::Label(holds));
        }
        ArgOp::Gt | ArgOp::Ge | ArgOp::Lt | ArgOp::Le => {
            // For Lt/Le the "holds" outcome is the negation of Ge/Gt.
            let (code, negate) = match c.op {
                ArgOp::Gt => (BPF_JMP_JGT_K, false),
                ArgOp::Ge => (BPF_JMP_JGE_K, false),
                ArgOp::Lt => (BPF_JMP_JGE_K, true),
                _ => (BPF_JMP_JGT_K, true),
            };
            let holds = e.label();
            let (yes, no) = if negate { (fail, holds) } else { (holds, fail) };
            if !c.width32 {
                e.stmt(BPF_LD_W_ABS, high);
                // A larger high word decides "greater", a smaller one "not greater".
                e.branch_if(BPF_JMP_JGT_K, v_hi, yes);
                e.jump(BPF_JMP_JEQ_K, v_hi, 1, 0);
                e.insns.push(Insn::JumpTo(no));
            }
            e.stmt(BPF_LD_W_ABS, low);
            e.branch_if(code, v_lo, yes);
            e.insns.push(Insn::JumpTo(no));
            e.insns.push(Insn::Label(holds));
        }
    }
}

fn emit_syscall_policy(e: &mut Emitter, policy: &SyscallPolicy) {
    for rule in &policy.rules {
        let next_rule = e.label();
        for condition in &rule.conditions {
            emit_condition(e, condition, next_rule);
        }
        e.ret(rule.action);
        e.insns.push(Insn::Label(next_rule));
    }
    e.ret(policy.otherwise);
}

/// Where a run of consecutive syscall numbers goes.
#[derive(Clone, Copy, PartialEq)]
enum RangeTarget {
    Return(SeccompAction),
    /// A syscall with argument rules, emitted as its own block.
    Block(usize),
}

/// Binary search over ranges `[start, next start)`; the accumulator holds the number.
/// Consecutive numbers with the same simple action share one range, which keeps the
/// program small (fast to JIT at every cell start, fast to run at every syscall).
fn emit_ranges(e: &mut Emitter, ranges: &[(u32, RangeTarget)]) {
    if let [(_, target)] = ranges {
        match *target {
            RangeTarget::Return(action) => e.ret(action),
            RangeTarget::Block(label) => e.insns.push(Insn::JumpTo(label)),
        }
        return;
    }
    let mid = ranges.len() / 2;
    let upper = e.label();
    e.branch_if(BPF_JMP_JGE_K, ranges[mid].0, upper);
    emit_ranges(e, &ranges[..mid]);
    e.insns.push(Insn::Label(upper));
    emit_ranges(e, &ranges[mid..]);
}

/// Compiles `policy` into a seccomp BPF program for x86_64.
pub fn compile(policy: &SeccompPolicy) -> Result<Vec<BpfInsn>, String> {
    let mut e = Emitter {
        insns: Vec::new(),
        next_label: 0,
    };
    let kill = e.label();
    // Foreign architectures (e.g. int 0x80 i386 calls) and the x32 ABI reuse syscall
    // numbers with other meanings: an allowlist keyed on x86_64 numbers would be bypassed.
    e.stmt(BPF_LD_W_ABS, OFFSET_ARCH);
    e.require(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, kill);
    e.stmt(BPF_LD_W_ABS, OFFSET_NR);
    e.branch_if(BPF_JMP_JGE_K, X32_SYSCALL_BIT, kill);

    // Numbers the kernel does not know get ENOSYS (so libc feature probes fall back);
    // known but unlisted ones get the policy's default.
    let unknown = RangeTarget::Return(SeccompAction::Errno(ENOSYS));
    let mut ranges: Vec<(u32, RangeTarget)> = Vec::new();
    let mut blocks = Vec::new();
    let push = |ranges: &mut Vec<(u32, RangeTarget)>, nr: u32, target: RangeTarget| {
        if ranges.last().is_none_or(|(_, t)| *t != target) {
            ranges.push((nr, target));
        }
    };
    let mut expected = 0u32;
    for (_, nr) in X86_64_SYSCALLS {
        if *nr > expected {
            push(&mut ranges, expected, unknown);
        }
        let target = match policy.syscalls.get(nr) {
            None => RangeTarget::Return(policy.default_action),
            Some(p) if p.rules.is_empty() => RangeTarget::Return(p.otherwise),
            Some(p) => {
                let label = e.label();
                blocks.push((label, p));
                RangeTarget::Block(label)
            }
        };
        push(&mut ranges, *nr, target);
        expected = nr + 1;
    }
    push(&mut ranges, expected, unknown);
    emit_ranges(&mut e, &ranges);
    for (label, body) in blocks {
        e.insns.push(Insn::Label(label));
        emit_syscall_policy(&mut e, body);
    }
    e.insns.push(Insn::Label(kill));
    e.ret(SeccompAction::KillProcess);
    e.finish()
}
