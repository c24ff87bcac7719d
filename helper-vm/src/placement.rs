//! Where guests run: on the host's KVM, or inside the helper VM when the host's KVM cannot run
//! a Linux guest (the CPUID probe guest of [`vmm::probe::host_report`] says why).

/// The user's choice (`--host-vm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum HostVmMode {
    /// Use the helper VM only when the host's KVM cannot run the guest.
    Auto,
    /// Always run inside the helper VM.
    Always,
    /// Never: use the host's /dev/kvm directly.
    Never,
}

/// Where guests of this invocation run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    Host,
    /// In the helper VM, because of `reason` (`--host-vm always`, or what the host probe found).
    HelperVm {
        reason: String,
    },
}

impl Placement {
    /// Whether guests run in the helper VM.
    pub fn in_helper_vm(&self) -> bool {
        matches!(self, Placement::HelperVm { .. })
    }

    /// Where, in words: "host" or "helper VM".
    pub fn name(&self) -> &'static str {
        match self {
            Placement::Host => "host",
            Placement::HelperVm { .. } => "helper VM",
        }
    }

    /// Why guests run in the helper VM (`None` on the host).
    pub fn reason(&self) -> Option<&str> {
        match self {
            Placement::Host => None,
            Placement::HelperVm { reason } => Some(reason),
        }
    }
}

/// Decides where guests run; `Auto` probes the host (opens `/dev/kvm`, may boot the CPUID
/// probe guest).
pub fn placement(mode: HostVmMode) -> Placement {
    match mode {
        HostVmMode::Never => Placement::Host,
        HostVmMode::Always => Placement::HelperVm {
            reason: "--host-vm always".into(),
        },
        HostVmMode::Auto => match vmm::probe::host_report().reason {
            None => Placement::Host,
            Some(reason) => Placement::HelperVm { reason },
        },
    }
}

/// Whether the helper VM's QEMU ([`crate::DEFAULT_QEMU`]) is on `PATH`.
pub fn qemu_available() -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(crate::DEFAULT_QEMU).is_file()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_modes_need_no_probe() {
        assert_eq!(placement(HostVmMode::Never), Placement::Host);
        assert_eq!(
            placement(HostVmMode::Always),
            Placement::HelperVm {
                reason: "--host-vm always".into()
            }
        );
        let helper = placement(HostVmMode::Always);
        assert!(helper.in_helper_vm() && !Placement::Host.in_helper_vm());
        assert_eq!(
            (helper.name(), helper.reason()),
            ("helper VM", Some("--host-vm always"))
        );
        assert_eq!(
            (Placement::Host.name(), Placement::Host.reason()),
            ("host", None)
        );
    }
}
