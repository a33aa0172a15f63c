//! The cell's seccomp filter as the kernel takes it. The policy, the Docker profile
//! parsing and the BPF compiler are in the contract crate (`airlock_contract::seccomp`):
//! the plan holds the finished program, and the runtime only turns it into the kernel's
//! `sock_filter` layout, after checking it is the program the plan as enforced names.

use crate::error::CellError;
use airlock_contract::seccomp::program_sha256;
use airlock_contract::SeccompPlan;

/// The plan's program, ready for `seccomp(2)`. Refused when it is empty or its hash is
/// not the plan's filter identity (a plan read back from its serialised form carries no
/// program): the filter installed is always the one the result record names.
pub fn program(plan: &SeccompPlan) -> Result<Vec<libc::sock_filter>, CellError> {
    if plan.program.is_empty() || program_sha256(&plan.program) != plan.filter.sha256 {
        return Err(CellError::Seccomp(format!(
            "the plan's program ({} instructions) is not the filter {} it names",
            plan.program.len(),
            plan.filter.sha256
        )));
    }
    Ok(plan
        .program
        .iter()
        .map(|insn| libc::sock_filter {
            code: insn.code,
            jt: insn.jt,
            jf: insn.jf,
            k: insn.k,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_contract::{compile, default_contract, CompileInput};

    fn default_plan() -> SeccompPlan {
        compile(
            &default_contract(),
            &CompileInput::new(std::path::Path::new("/"), &["true".to_owned()]),
        )
        .unwrap()
        .seccomp
    }

    #[test]
    fn the_installed_program_is_the_plans_instruction_for_instruction() {
        let plan = default_plan();
        let program = program(&plan).unwrap();
        assert_eq!(program.len(), plan.program.len());
        for (kernel, planned) in program.iter().zip(plan.program.iter()) {
            let bytes = planned.to_bytes();
            assert_eq!(kernel.code.to_le_bytes(), bytes[..2]);
            assert_eq!([kernel.jt, kernel.jf], bytes[2..4]);
            assert_eq!(kernel.k.to_le_bytes(), bytes[4..]);
            // The kernel's struct is exactly these 8 bytes.
            assert_eq!(std::mem::size_of_val(kernel), bytes.len());
        }
    }

    #[test]
    fn a_program_that_is_not_the_named_filter_is_refused() {
        let mut plan = default_plan();
        plan.program.to_mut().pop();
        assert!(program(&plan).is_err());
        let read_back: SeccompPlan =
            serde_json::from_value(serde_json::to_value(default_plan()).unwrap()).unwrap();
        assert!(read_back.program.is_empty());
        assert!(
            program(&read_back).is_err(),
            "no program, nothing installed"
        );
    }
}
