//! What a TMA tiled load (`cp.async.bulk.tensor.Nd...tile`) writes into
//! shared memory: the box of the tensor map at the given coordinates,
//! elements out of the tensor zero-filled, laid out densely (dimension 0
//! innermost) and swizzled as the map says, in 16-byte chunks.

use flash_attn_abi::sm90::{OobFill, TensorMapParams, TmaSwizzle};

/// A piece of a box: 16 bytes for one shared address.
pub(crate) type Chunk = (u32, [u8; 16]);

/// The shared-memory chunks of the box of `map` at `coords` (innermost
/// first) landing at `dst`; `read(address, bytes)` reads global memory
/// (and checks it). `Err` says why the operands are invalid or outside
/// what the emulator models.
pub(crate) fn load_box<E>(
    map: &TensorMapParams,
    coords: &[i32],
    dst: u32,
    mut read: impl FnMut(u64, usize) -> Result<Vec<u8>, E>,
) -> Result<Result<Vec<Chunk>, E>, String> {
    let rank = map.rank as usize;
    if coords.len() != rank {
        return Err(format!("a {}-d copy of a tensor map of rank {rank}", coords.len()));
    }
    if map.oob_fill != OobFill::Zero {
        return Err("out-of-bounds fill NaN_REQUEST_ZERO_FMA (not modelled: only zero fill)".into());
    }
    if map.element_strides[0] != 1 {
        return Err("an element stride other than 1 in dimension 0 (not modelled)".into());
    }
    let size = map.data_type.size() as usize;
    let counts: Vec<usize> = (0..rank).map(|i| map.box_dims[i].div_ceil(map.element_strides[i]) as usize).collect();
    let row_bytes = counts[0] * size;
    let span = map.swizzle.bytes();
    if !dst.is_multiple_of(128) {
        return Err(format!("shared destination {dst:#x} not 128-byte aligned"));
    }
    if map.swizzle != TmaSwizzle::None {
        if row_bytes != span as usize {
            return Err(format!(
                "a swizzled box row of {row_bytes} bytes, narrower than the {span}-byte span (not modelled)"
            ));
        }
        if !dst.is_multiple_of(8 * span) {
            return Err(format!("shared destination {dst:#x} not aligned to the swizzle's {}-byte repeat", 8 * span));
        }
    }
    let rows: usize = counts[1..].iter().product();
    let mut chunks = Vec::with_capacity(rows * row_bytes / 16);
    for row in 0..rows {
        let mut bytes = vec![0u8; row_bytes];
        // The row's global coordinates in dimensions 1.., and whether it is
        // inside the tensor.
        let (mut rest, mut offset, mut inside) = (row, 0i128, true);
        for i in 1..rank {
            let g = i64::from(coords[i]) + (rest % counts[i]) as i64 * i64::from(map.element_strides[i]);
            rest /= counts[i];
            inside &= g >= 0 && (g as u64) < map.global_dims[i];
            offset += i128::from(g) * map.global_strides[i - 1] as i128;
        }
        if inside {
            // The elements of dimension 0 inside the tensor: one run.
            let first = i64::from(coords[0]).max(0);
            let end = (i64::from(coords[0]) + counts[0] as i64).min(map.global_dims[0] as i64);
            if first < end {
                let addr = map.global_address as i128 + offset + i128::from(first) * size as i128;
                let at = (first - i64::from(coords[0])) as usize * size;
                let len = (end - first) as usize * size;
                match read(addr as u64, len) {
                    Ok(data) => bytes[at..at + len].copy_from_slice(&data),
                    Err(e) => return Ok(Err(e)),
                }
            }
        }
        for (c, piece) in bytes.as_chunks::<16>().0.iter().enumerate() {
            let addr = dst + (row * row_bytes + 16 * c) as u32;
            let physical = match span {
                0 => addr,
                _ => addr ^ (((addr >> 7) & ((span / 16) - 1)) << 4),
            };
            chunks.push((physical, *piece));
        }
    }
    Ok(Ok(chunks))
}
