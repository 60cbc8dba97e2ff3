//! Variable-length batches: sequences of different lengths packed one after
//! another along the token dimension, located by their offsets
//! (FlashAttention-2's `cu_seqlens`).

use crate::context::DeviceArray;
use crate::error::{Error, Result};
use crate::validate::{check_seq_offsets, OffsetsArg};

/// The offsets of packed sequences, validated and uploaded: sequence `b`
/// is tokens `offsets[b]..offsets[b + 1]`. Keeps a host copy, from which
/// the attention calls check the token counts and take the longest length.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let _context = flash_attn::cust::quick_init()?;
/// use flash_attn::SeqOffsets;
/// // Three sequences of 5, 0 and 7 tokens: offsets [0, 5, 5, 12].
/// let cu_seqlens = SeqOffsets::from_lengths(&[5, 0, 7])?;
/// assert_eq!((cu_seqlens.batch(), cu_seqlens.total(), cu_seqlens.max_len()), (3, 12, 7));
/// assert_eq!(cu_seqlens.offsets(), SeqOffsets::new(&[0, 5, 5, 12])?.offsets());
/// # Ok(()) }
/// ```
pub struct SeqOffsets {
    host: Vec<i32>,
    device: DeviceArray<i32>,
    max_len: usize,
}

/// The offsets of sequences of `lengths` tokens, packed in order.
pub fn offsets_from_lengths(lengths: &[usize]) -> Result<Vec<i32>> {
    let mut offsets = Vec::with_capacity(lengths.len() + 1);
    let mut total = 0usize;
    offsets.push(0);
    for &len in lengths {
        total = total.saturating_add(len);
        let offset = i32::try_from(total).map_err(|_| Error::TooLarge {
            what: "total tokens of the sequences",
            value: total,
            max: i32::MAX as usize,
        })?;
        offsets.push(offset);
    }
    Ok(offsets)
}

impl SeqOffsets {
    /// Checks `offsets` (see [`check_seq_offsets`]) and uploads them to the
    /// current context's device.
    pub fn new(offsets: &[i32]) -> Result<Self> {
        let summary = check_seq_offsets(offsets)?;
        Ok(Self { host: offsets.to_vec(), device: DeviceArray::upload(offsets)?, max_len: summary.max_len })
    }

    /// The offsets of sequences of `lengths` tokens, packed in order.
    pub fn from_lengths(lengths: &[usize]) -> Result<Self> {
        Self::new(&offsets_from_lengths(lengths)?)
    }

    /// Number of sequences.
    pub fn batch(&self) -> usize {
        self.host.len() - 1
    }

    /// Tokens of all sequences.
    pub fn total(&self) -> usize {
        self.host[self.host.len() - 1] as usize
    }

    /// The longest sequence.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The offsets, `batch() + 1` of them.
    pub fn offsets(&self) -> &[i32] {
        &self.host
    }

    pub(crate) fn arg(&self) -> OffsetsArg<'_> {
        OffsetsArg { host: &self.host, addr: self.device.addr() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_from_lengths_sum_in_order_and_fit_i32() {
        assert_eq!(offsets_from_lengths(&[5, 0, 7]).unwrap(), vec![0, 5, 5, 12]);
        assert_eq!(offsets_from_lengths(&[]).unwrap(), vec![0]);
        let half = i32::MAX as usize / 2 + 1;
        assert!(matches!(
            offsets_from_lengths(&[half, half]).unwrap_err(),
            Error::TooLarge { what: "total tokens of the sequences", .. }
        ));
    }
}
