//! Descriptor-level I/O, in one place: a directory read beneath a descriptor the host holds
//! (`beneath`: opening, listing, removing one name at a time, never following a link or crossing a
//! mount), the files a process left gathered within limits (`collect`) or a tree copied out (`copy`),
//! and descriptors passed between processes (`pass`: pipes, `SCM_RIGHTS`, credentials, pidfds).
//! The host never follows a path the code controls: everything here starts from a descriptor.

pub(crate) mod beneath;
pub(crate) mod collect;
pub(crate) mod copy;
pub(crate) mod pass;

pub use beneath::BeneathDir;
pub use collect::{
    collect_files, collect_files_in, CollectLimits, CollectedFile, CollectedFiles, SkippedEntry,
    MAX_SKIPPED_NAMED,
};
pub use copy::CopyReport;
pub use pass::{
    pass_credentials, pidfd_signal, pipe, recv_fd, recv_with_fds_and_sender, send_with_fds,
    seqpacket_pair,
};
