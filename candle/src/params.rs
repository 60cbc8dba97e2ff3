//! candle-flash-attn's arguments as flash-attn's parameters: pure functions,
//! tested on the CPU.

/// The mask and score transforms of one call, as flash-attn takes them
/// (`flash_attn::AttentionParams` less the ALiBi slopes and split count,
/// which are device data and a tuning knob).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Translated {
    /// Bottom-right-aligned causal mask.
    pub causal: bool,
    /// FlashAttention-2's `window_size`, `None` for its -1 (unbounded).
    pub window: (Option<usize>, Option<usize>),
    /// Multiplies `q k^T` before the softmax.
    pub softmax_scale: f32,
    /// `c * tanh(s / c)` on the scaled scores; `None` for no softcap.
    pub softcap: Option<f32>,
}

/// Translates candle-flash-attn's arguments exactly as its launcher does
/// before calling the FlashAttention-2 kernels:
///
/// - a window side larger than `seqlen_k` (the longest key sequence:
///   `max_seqlen_k` for variable lengths) is unbounded, like `None`;
/// - `(None, Some(0))` is the causal mask;
/// - otherwise a bounded side with an unbounded other side gets `seqlen_k`
///   on the unbounded side (FlashAttention-2's local mask);
/// - a softcap that is not positive (candle-flash-attn passes 0.0 for none)
///   means no softcap.
pub fn translate(
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
    seqlen_k: usize,
) -> Translated {
    let left = window_size_left.filter(|&w| w <= seqlen_k);
    let right = window_size_right.filter(|&w| w <= seqlen_k);
    let (causal, window) = match (left, right) {
        (None, Some(0)) => (true, (None, None)),
        (None, Some(right)) => (false, (Some(seqlen_k), Some(right))),
        (Some(left), None) => (false, (Some(left), Some(seqlen_k))),
        (left, right) => (false, (left, right)),
    };
    Translated { causal, window, softmax_scale, softcap: softcap.filter(|&c| c > 0.0) }
}

/// The `(window_size_left, window_size_right)` that candle-flash-attn's
/// `causal` flag stands for.
pub fn causal_window(causal: bool) -> (Option<usize>, Option<usize>) {
    (None, if causal { Some(0) } else { None })
}

/// Cumulative sequence offsets (`[0, len_0, len_0 + len_1, ...]`, as
/// candle-flash-attn's `seqlens_q` / `seqlens_k` hold them) checked and
/// converted for flash-attn, with the longest sequence. `max_seqlen` is the
/// caller's bound: a sequence longer than it is an error (candle-flash-attn
/// would silently leave its tail uncomputed).
pub fn offsets(name: &str, cu_seqlens: &[u32], max_seqlen: usize) -> Result<(Vec<i32>, usize), String> {
    if cu_seqlens.len() < 2 {
        return Err(format!("{name} should have a len >= 2 (batch + 1 offsets), got {}", cu_seqlens.len()));
    }
    if cu_seqlens[0] != 0 {
        return Err(format!("{name} must start at 0, got {}", cu_seqlens[0]));
    }
    let mut longest = 0;
    for (b, pair) in cu_seqlens.windows(2).enumerate() {
        let Some(len) = pair[1].checked_sub(pair[0]) else {
            return Err(format!(
                "{name} must not decrease: {name}[{}] = {} > {name}[{}] = {}",
                b,
                pair[0],
                b + 1,
                pair[1]
            ));
        };
        longest = longest.max(len as usize);
    }
    if longest > max_seqlen {
        return Err(format!("{name} has a sequence of {longest} tokens, longer than its max_seqlen {max_seqlen}"));
    }
    let offsets = cu_seqlens
        .iter()
        .map(|&o| i32::try_from(o).map_err(|_| format!("{name} offset {o} does not fit in i32")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((offsets, longest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_flag_is_left_none_right_zero() {
        assert_eq!(causal_window(true), (None, Some(0)));
        assert_eq!(causal_window(false), (None, None));
        let t = translate(0.125, None, Some(0), None, 100);
        assert!(t.causal);
        assert_eq!(t.window, (None, None));
        assert_eq!(t.softmax_scale, 0.125);
    }

    #[test]
    fn no_window_is_full_attention() {
        let t = translate(1.0, None, None, None, 100);
        assert!(!t.causal);
        assert_eq!(t.window, (None, None));
    }

    #[test]
    fn sides_beyond_seqlen_k_are_unbounded() {
        assert_eq!(translate(1.0, Some(101), Some(101), None, 100).window, (None, None));
        // A side equal to seqlen_k stays bounded, as in candle-flash-attn.
        assert_eq!(translate(1.0, Some(100), Some(3), None, 100).window, (Some(100), Some(3)));
        // Left beyond seqlen_k with right 0 becomes the causal mask.
        let t = translate(1.0, Some(500), Some(0), None, 100);
        assert!(t.causal);
        assert_eq!(t.window, (None, None));
    }

    #[test]
    fn one_bounded_side_gets_seqlen_k_on_the_other() {
        let t = translate(1.0, Some(16), None, None, 100);
        assert!(!t.causal);
        assert_eq!(t.window, (Some(16), Some(100)));
        let t = translate(1.0, None, Some(4), None, 100);
        assert!(!t.causal);
        assert_eq!(t.window, (Some(100), Some(4)));
        let t = translate(1.0, Some(16), Some(0), None, 100);
        assert!(!t.causal);
        assert_eq!(t.window, (Some(16), Some(0)));
    }

    #[test]
    fn softcap_zero_or_negative_is_none() {
        assert_eq!(translate(1.0, None, None, Some(0.0), 8).softcap, None);
        assert_eq!(translate(1.0, None, None, Some(-1.0), 8).softcap, None);
        assert_eq!(translate(1.0, None, None, Some(f32::NAN), 8).softcap, None);
        assert_eq!(translate(1.0, None, None, Some(30.0), 8).softcap, Some(30.0));
    }

    #[test]
    fn offsets_are_checked() {
        assert_eq!(offsets("seqlens_q", &[0, 3, 10], 7), Ok((vec![0, 3, 10], 7)));
        assert!(offsets("seqlens_q", &[0], 7).unwrap_err().contains("len >= 2"));
        assert!(offsets("seqlens_q", &[1, 3], 7).unwrap_err().contains("start at 0"));
        assert!(offsets("seqlens_k", &[0, 5, 3], 7).unwrap_err().contains("must not decrease"));
        assert!(offsets("seqlens_k", &[0, 5, 13], 7).unwrap_err().contains("longer than its max_seqlen 7"));
        assert!(offsets("seqlens_k", &[0, u32::MAX], usize::MAX).unwrap_err().contains("i32"));
    }
}
