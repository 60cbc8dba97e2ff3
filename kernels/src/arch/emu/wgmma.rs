//! `wgmma.mma_async` (m64nNk16, f32 accumulators, f16/bf16 operands): where
//! its shared-memory operands lie, as the PTX ISA's "Matrix Descriptor
//! Format" and "Shared Memory Matrix Layout" define them, and each
//! thread's wgmma groups and fences.
//!
//! Operands are 16-bit, so 8 elements fill 16 bytes (`T = 8` below), and
//! every layout keeps 8 consecutive elements of the operand's major
//! dimension in one 16-byte chunk, which the swizzle moves as a whole.
//! With `SBO`/`LBO` the descriptor's stride and leading byte offsets, `W`
//! the swizzle span (32, 64, 128 bytes) and the pre-swizzle byte offset of
//! element `(mn, k)` from the start address (the canonical layouts, in
//! CuTe's notation `((8,m),(T,2)):((W/2,SBO),(1,T))` and so on):
//!
//! - K-major, swizzled: `(mn % 8) * W + (mn / 8) * SBO + 2 * (k % 8) + 16 * (k / 8)`;
//! - K-major, no swizzle: `(mn % 8) * 16 + (mn / 8) * SBO + 2 * (k % 8) + (k / 8) * LBO`;
//! - MN-major, swizzled: `2 * (mn % 8) + 16 * (mn / 8 % (W / 16)) + (mn / (8 * W / 16)) * LBO
//!   + (k % 8) * W + (k / 8) * SBO`;
//! - MN-major, no swizzle: `2 * (mn % 8) + (mn / 8) * SBO + (k % 8) * 16 + (k / 8) * LBO`.
//!
//! The swizzle then XORs the 16-byte chunk bits [4, 4 + b) of the shared
//! address with its bits [7, 7 + b) (b = 1, 2, 3 for 32, 64, 128 bytes):
//! chunk `c` of 128-byte row `r` of a 1024-byte atom lands at `c ^ (r % 8)`.
//! The emulator applies it to the absolute address with the descriptor's
//! base offset 0, which is what the hardware does when the operand's
//! swizzle atoms are aligned to their size (1024 bytes for 128B); a start
//! address inside an atom's rows (which needs the base offset) is refused.

use std::collections::VecDeque;
use std::panic::Location;

use flash_attn_abi::sm90::{DescriptorSwizzle, MatrixDescriptor};

type Site = &'static Location<'static>;

/// Whether an operand in shared memory is K-major (K contiguous) or
/// MN-major (M or N contiguous: B with `imm-trans-b` 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Major {
    K,
    Mn,
}

/// The shared address of the 16-byte chunk holding element `(mn, k)` of
/// the operand `desc` describes (its 8 elements along the major dimension
/// start at a multiple of 8), and the element's index in the chunk; or why
/// the descriptor is outside what the emulator models.
pub(crate) fn chunk_of(desc: &MatrixDescriptor, major: Major, mn: u32, k: u32) -> Result<(u32, u32), String> {
    if desc.base_offset != 0 {
        return Err(format!("matrix base offset {} (not modelled: only 0)", desc.base_offset));
    }
    let (lbo, sbo) = (desc.leading_byte_offset, desc.stride_byte_offset);
    let w = desc.swizzle.bytes();
    let swizzled = desc.swizzle != DescriptorSwizzle::None;
    // Rows of a swizzle atom: the address bits the pattern reads.
    let row_mask = w / 16 - 1;
    if swizzled && (desc.start >> 7) & row_mask != 0 {
        return Err(format!(
            "start address {:#x} inside a {w}-byte swizzle atom's rows (needs the matrix base offset, not modelled)",
            desc.start
        ));
    }
    let (offset, index) = match (major, swizzled) {
        (Major::K, true) => ((mn % 8) * w + (mn / 8) * sbo + 16 * (k / 8), k % 8),
        (Major::K, false) => ((mn % 8) * 16 + (mn / 8) * sbo + (k / 8) * lbo, k % 8),
        (Major::Mn, true) => {
            let per_row = w / 16;
            (16 * (mn / 8 % per_row) + (mn / (8 * per_row)) * lbo + (k % 8) * w + (k / 8) * sbo, mn % 8)
        }
        (Major::Mn, false) => ((mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo, mn % 8),
    };
    let addr = desc.start + offset;
    let physical = addr ^ (((addr >> 7) & row_mask) << 4);
    Ok((physical, index))
}

/// One thread's wgmma state: its warpgroup's groups as this thread issued
/// them (every thread of a warpgroup issues the same sequence), and its
/// `wgmma.fence`s.
#[derive(Default)]
pub(crate) struct WgmmaGroups {
    /// `wgmma.mma_async`s issued so far; each is numbered by the count.
    issued: u64,
    /// The newest wgmma of the group not yet committed.
    open: Option<u64>,
    /// Committed groups, oldest first: the newest wgmma of each (`None`
    /// for an empty group).
    committed: VecDeque<Option<u64>>,
    /// Every wgmma numbered up to this has completed.
    completed: u64,
    /// `wgmma.fence`s executed.
    pub fences: u64,
}

impl WgmmaGroups {
    /// A new wgmma: its number.
    pub fn issue(&mut self) -> u64 {
        self.issued += 1;
        self.open = Some(self.issued);
        self.issued
    }

    /// `wgmma.commit_group`.
    pub fn commit(&mut self) {
        let newest = self.open.take();
        self.committed.push_back(newest);
    }

    /// `wgmma.wait_group pending`.
    pub fn wait(&mut self, pending: usize) {
        while self.committed.len() > pending {
            if let Some(Some(newest)) = self.committed.pop_front() {
                self.completed = newest;
            }
        }
    }

    /// Every wgmma numbered up to this has completed.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Whether wgmma `number` has completed; if not, why.
    pub fn in_flight(&self, number: u64) -> Option<String> {
        if number <= self.completed {
            return None;
        }
        if self.open.is_some_and(|n| n >= number) && !self.committed.iter().flatten().any(|&n| n >= number) {
            return Some("its group is not even committed (no wgmma.commit_group since)".into());
        }
        let pending = self.committed.len();
        Some(format!("{pending} committed group(s) pending, and no wgmma.wait_group has covered its group"))
    }
}

/// What an accumulator knows of the wgmmas that wrote it and of the
/// thread's register accesses.
#[derive(Clone, Copy, Default)]
pub(crate) struct AccumulatorState {
    /// The newest wgmma writing it: number, site and instruction.
    pub written_by: Option<(u64, Site, &'static str)>,
    /// The thread's fence count at its last register access (`None`
    /// before any: the value it was made with counts as one).
    pub accessed_at_fence: Option<u64>,
    /// Where that access was.
    pub accessed_at: Option<Site>,
}
