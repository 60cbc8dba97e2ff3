//! The data the sm_90a primitives read besides registers: the TMA tensor
//! map (what `cp.async.bulk.tensor` copies, and how) and the wgmma
//! shared-memory matrix descriptor. Both the device code (which builds
//! descriptors), the CPU emulator (which decodes both) and the host (which
//! encodes tensor maps) use these definitions.
//!
//! **Tensor maps.** The driver's `CUtensorMap` is 128 opaque bytes that
//! `cuTensorMapEncodeTiled` fills; its layout is not documented and may
//! change between drivers. So on a GPU the host passes [`TensorMapParams`]
//! (whose enums carry the driver's numeric values) to
//! `cuTensorMapEncodeTiled` and hands the kernel the driver's blob, while
//! the emulator receives [`TensorMapParams::encode`]'s blob of the same
//! parameters: our own layout of the same 128 bytes, which
//! [`TensorMapParams::decode`] reads back. The kernel never looks inside
//! either; it passes the map's address to the TMA instruction.
//!
//! **Matrix descriptors.** [`MatrixDescriptor`] is the 64-bit value of the
//! PTX ISA's "Matrix Descriptor Format" (wgmma section): start address,
//! leading and stride byte offsets (each in 16-byte units, 14 bits), the
//! matrix base offset and the swizzle mode; the hardware reads it, so its
//! layout is the ISA's, not ours.

/// Element types of a tensor map: `CUtensorMapDataType`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum TensorDataType {
    U8 = 0,
    U16 = 1,
    U32 = 2,
    I32 = 3,
    U64 = 4,
    I64 = 5,
    F16 = 6,
    F32 = 7,
    F64 = 8,
    Bf16 = 9,
}

impl TensorDataType {
    /// Bytes of one element.
    pub const fn size(self) -> u32 {
        match self {
            TensorDataType::U8 => 1,
            TensorDataType::U16 | TensorDataType::F16 | TensorDataType::Bf16 => 2,
            TensorDataType::U32 | TensorDataType::I32 | TensorDataType::F32 => 4,
            TensorDataType::U64 | TensorDataType::I64 | TensorDataType::F64 => 8,
        }
    }

    const fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => TensorDataType::U8,
            1 => TensorDataType::U16,
            2 => TensorDataType::U32,
            3 => TensorDataType::I32,
            4 => TensorDataType::U64,
            5 => TensorDataType::I64,
            6 => TensorDataType::F16,
            7 => TensorDataType::F32,
            8 => TensorDataType::F64,
            9 => TensorDataType::Bf16,
            _ => return None,
        })
    }
}

/// Shared-memory swizzle of a TMA box (`CUtensorMapSwizzle`'s values).
/// With `B32`/`B64`/`B128`, the 16-byte chunk bits [4, 4 + b) of each
/// shared address are XORed with its bits [7, 7 + b), b = 1, 2, 3: for
/// 128 bytes, chunk `c` of 128-byte row `r` lands at chunk `c ^ (r % 8)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum TmaSwizzle {
    None = 0,
    B32 = 1,
    B64 = 2,
    B128 = 3,
}

impl TmaSwizzle {
    /// The span of the pattern in bytes (a swizzled box row fits in it);
    /// `None` has no span.
    pub const fn bytes(self) -> u32 {
        match self {
            TmaSwizzle::None => 0,
            TmaSwizzle::B32 => 32,
            TmaSwizzle::B64 => 64,
            TmaSwizzle::B128 => 128,
        }
    }

    const fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => TmaSwizzle::None,
            1 => TmaSwizzle::B32,
            2 => TmaSwizzle::B64,
            3 => TmaSwizzle::B128,
            _ => return None,
        })
    }
}

/// How out-of-bounds box elements are filled (`CUtensorMapFloatOOBfill`):
/// `Zero` is the driver's `NONE` (zeros), `NanRequestZeroFma` fills floats
/// with NaN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum OobFill {
    Zero = 0,
    NanRequestZeroFma = 1,
}

/// L2 promotion of the copies (`CUtensorMapL2promotion`): a performance
/// hint, carried for the driver call, with no effect on the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum L2Promotion {
    None = 0,
    B64 = 1,
    B128 = 2,
    B256 = 3,
}

/// The most dimensions a tiled tensor map has.
pub const TENSOR_MAP_MAX_RANK: usize = 5;

/// The parameters of `cuTensorMapEncodeTiled` that the kernels use, with
/// interleave fixed to none. Dimension 0 is the innermost (contiguous) one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMapParams {
    pub data_type: TensorDataType,
    /// Dimensions used, 1..=5.
    pub rank: u32,
    /// Global address of element 0 (16-byte aligned).
    pub global_address: u64,
    /// Elements along each dimension (`globalDim`).
    pub global_dims: [u64; TENSOR_MAP_MAX_RANK],
    /// Bytes between consecutive indices of dimensions 1..rank
    /// (`globalStrides`, multiples of 16); dimension 0 is contiguous.
    pub global_strides: [u64; TENSOR_MAP_MAX_RANK - 1],
    /// Elements of the box along each dimension (`boxDim`, 1..=256).
    pub box_dims: [u32; TENSOR_MAP_MAX_RANK],
    /// Traversal stride along each dimension (`elementStrides`, 1..=8): the
    /// box takes every `s`-th element, `ceil(box / s)` of them.
    pub element_strides: [u32; TENSOR_MAP_MAX_RANK],
    pub swizzle: TmaSwizzle,
    pub l2_promotion: L2Promotion,
    pub oob_fill: OobFill,
}

/// A tensor map as the kernel receives it: 128 bytes, 64-byte aligned
/// (`CUtensorMap`). On a GPU the driver's encoding, in the emulator ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct TensorMap(pub [u64; 16]);

/// Why a tensor map blob or its parameters are not valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorMapError {
    /// Not a blob of [`TensorMapParams::encode`] (e.g. the driver's).
    NotOurEncoding,
    /// A field outside what `cuTensorMapEncodeTiled` accepts; the text says which.
    Invalid(&'static str),
}

/// Word 0 of our blob: this tag in the high 32 bits, so that the emulator
/// recognises a driver blob or garbage instead of misreading it.
const MAGIC: u64 = 0x7e45_0001 << 32;

impl TensorMapParams {
    /// Bytes of one box as it lands in shared memory (the transaction bytes
    /// a load completes on its mbarrier, out-of-bounds elements included).
    pub const fn box_bytes(&self) -> u32 {
        let mut bytes = self.data_type.size();
        let mut i = 0;
        while i < self.rank as usize {
            bytes *= self.box_dims[i].div_ceil(self.element_strides[i]);
            i += 1;
        }
        bytes
    }

    /// Checks the rules of `cuTensorMapEncodeTiled` (CUDA driver API) for
    /// the fields we carry.
    pub fn validate(&self) -> Result<(), TensorMapError> {
        let invalid = |what| Err(TensorMapError::Invalid(what));
        if self.rank < 1 || self.rank as usize > TENSOR_MAP_MAX_RANK {
            return invalid("rank must be 1..=5");
        }
        if self.global_address % 16 != 0 {
            return invalid("the global address must be 16-byte aligned");
        }
        let mut i = 0;
        while i < self.rank as usize {
            if self.global_dims[i] == 0 || self.global_dims[i] > 1 << 32 {
                return invalid("every global dimension must be 1..=2^32");
            }
            if self.box_dims[i] == 0 || self.box_dims[i] > 256 {
                return invalid("every box dimension must be 1..=256");
            }
            if self.element_strides[i] == 0 || self.element_strides[i] > 8 {
                return invalid("every element stride must be 1..=8");
            }
            if i > 0 {
                let stride = self.global_strides[i - 1];
                if stride % 16 != 0 || stride >= 1 << 40 {
                    return invalid("every global stride must be a multiple of 16 below 2^40");
                }
            }
            i += 1;
        }
        let inner_bytes = self.box_dims[0] * self.data_type.size();
        if inner_bytes % 16 != 0 {
            return invalid("the box's inner dimension must span a multiple of 16 bytes");
        }
        if !matches!(self.swizzle, TmaSwizzle::None) && inner_bytes > self.swizzle.bytes() {
            return invalid("with a swizzle, the box's inner dimension must fit in the swizzle span");
        }
        Ok(())
    }

    /// Our 128-byte encoding: word 0 the tag and the small fields, word 1
    /// the address, words 2..7 the dims, 7..11 the strides, 11 the box dims
    /// (16 bits each, first four), 12 the fifth box dim and the element
    /// strides (8 bits each). Invalid parameters are refused, as the driver
    /// refuses them.
    pub fn encode(&self) -> Result<TensorMap, TensorMapError> {
        self.validate()?;
        let mut w = [0u64; 16];
        w[0] = MAGIC
            | self.data_type as u64
            | (self.rank as u64) << 8
            | (self.swizzle as u64) << 12
            | (self.l2_promotion as u64) << 16
            | (self.oob_fill as u64) << 20;
        w[1] = self.global_address;
        let mut i = 0;
        while i < TENSOR_MAP_MAX_RANK {
            w[2 + i] = self.global_dims[i];
            if i < 4 {
                w[7 + i] = self.global_strides[i];
                w[11] |= (self.box_dims[i] as u64) << (16 * i);
            }
            w[12] |= (self.element_strides[i] as u64) << (16 + 8 * i);
            i += 1;
        }
        w[12] |= self.box_dims[4] as u64;
        Ok(TensorMap(w))
    }

    /// Reads back what [`Self::encode`] wrote, and checks it again.
    pub fn decode(map: &TensorMap) -> Result<Self, TensorMapError> {
        let w = &map.0;
        if w[0] >> 32 != MAGIC >> 32 {
            return Err(TensorMapError::NotOurEncoding);
        }
        let field = |shift: u32| ((w[0] >> shift) & 0xf) as u32;
        let Some(data_type) = TensorDataType::from_u32((w[0] & 0xff) as u32) else {
            return Err(TensorMapError::Invalid("unknown data type"));
        };
        let Some(swizzle) = TmaSwizzle::from_u32(field(12)) else {
            return Err(TensorMapError::Invalid("unknown swizzle"));
        };
        let l2_promotion = match field(16) {
            0 => L2Promotion::None,
            1 => L2Promotion::B64,
            2 => L2Promotion::B128,
            3 => L2Promotion::B256,
            _ => return Err(TensorMapError::Invalid("unknown L2 promotion")),
        };
        let oob_fill = match field(20) {
            0 => OobFill::Zero,
            1 => OobFill::NanRequestZeroFma,
            _ => return Err(TensorMapError::Invalid("unknown out-of-bounds fill")),
        };
        let mut params = TensorMapParams {
            data_type,
            rank: field(8),
            global_address: w[1],
            global_dims: [0; TENSOR_MAP_MAX_RANK],
            global_strides: [0; TENSOR_MAP_MAX_RANK - 1],
            box_dims: [0; TENSOR_MAP_MAX_RANK],
            element_strides: [0; TENSOR_MAP_MAX_RANK],
            swizzle,
            l2_promotion,
            oob_fill,
        };
        let mut i = 0;
        while i < TENSOR_MAP_MAX_RANK {
            params.global_dims[i] = w[2 + i];
            if i < 4 {
                params.global_strides[i] = w[7 + i];
                params.box_dims[i] = ((w[11] >> (16 * i)) & 0xffff) as u32;
            }
            params.element_strides[i] = ((w[12] >> (16 + 8 * i)) & 0xff) as u32;
            i += 1;
        }
        params.box_dims[4] = (w[12] & 0xffff) as u32;
        params.validate()?;
        Ok(params)
    }
}

/// The swizzle mode of a wgmma matrix descriptor (bits 62-63; note the ISA
/// numbers them differently from [`TmaSwizzle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescriptorSwizzle {
    /// No swizzle ("interleave": 8x16-byte core matrices).
    None = 0,
    B128 = 1,
    B64 = 2,
    B32 = 3,
}

impl DescriptorSwizzle {
    /// The span of the pattern in bytes; 16 for `None` (one core-matrix row).
    pub const fn bytes(self) -> u32 {
        match self {
            DescriptorSwizzle::None => 16,
            DescriptorSwizzle::B32 => 32,
            DescriptorSwizzle::B64 => 64,
            DescriptorSwizzle::B128 => 128,
        }
    }
}

/// A wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor
/// Format"): bits 0-13 start address >> 4, 16-29 leading dimension byte
/// offset >> 4, 32-45 stride dimension byte offset >> 4, 49-51 matrix base
/// offset, 62-63 swizzle mode. What the two offsets mean depends on the
/// operand's major-ness and the swizzle (the ISA's "Shared Memory Matrix
/// Layout"; `arch::emu` documents the layouts it reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixDescriptor {
    /// Shared-window byte address of the matrix (16-byte aligned, < 2^18).
    pub start: u32,
    /// Leading dimension byte offset (multiple of 16, < 2^18).
    pub leading_byte_offset: u32,
    /// Stride dimension byte offset (multiple of 16, < 2^18).
    pub stride_byte_offset: u32,
    /// Matrix base offset (0..8): for a swizzled matrix whose start is not
    /// at the pattern's repeat boundary.
    pub base_offset: u32,
    pub swizzle: DescriptorSwizzle,
}

impl MatrixDescriptor {
    /// The 64-bit descriptor. Address bits below 16 bytes and above the
    /// 14-bit fields are dropped, as the hardware drops them.
    #[inline(always)]
    pub const fn encode(&self) -> u64 {
        descriptor_field(self.start)
            | descriptor_field(self.leading_byte_offset) << 16
            | descriptor_field(self.stride_byte_offset) << 32
            | ((self.base_offset & 7) as u64) << 49
            | (self.swizzle as u64) << 62
    }

    pub fn decode(desc: u64) -> Self {
        let field = |shift: u32| (((desc >> shift) & 0x3fff) as u32) << 4;
        MatrixDescriptor {
            start: field(0),
            leading_byte_offset: field(16),
            stride_byte_offset: field(32),
            base_offset: ((desc >> 49) & 7) as u32,
            swizzle: match desc >> 62 {
                0 => DescriptorSwizzle::None,
                1 => DescriptorSwizzle::B128,
                2 => DescriptorSwizzle::B64,
                _ => DescriptorSwizzle::B32,
            },
        }
    }
}

/// A byte address or offset as a 14-bit descriptor field (16-byte units).
#[inline(always)]
const fn descriptor_field(bytes: u32) -> u64 {
    ((bytes >> 4) & 0x3fff) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> TensorMapParams {
        TensorMapParams {
            data_type: TensorDataType::F16,
            rank: 3,
            global_address: 0x7f00_1234_5670,
            global_dims: [128, 1000, 7, 1, 1],
            global_strides: [2 * 128 * 7, 256, 0, 0],
            box_dims: [64, 128, 1, 1, 1],
            element_strides: [1, 2, 1, 1, 1],
            swizzle: TmaSwizzle::B128,
            l2_promotion: L2Promotion::B128,
            oob_fill: OobFill::Zero,
        }
    }

    #[test]
    fn tensor_maps_round_trip() {
        let p = params();
        assert_eq!(TensorMapParams::decode(&p.encode().unwrap()), Ok(p));
        assert_eq!(p.box_bytes(), 64 * 64 * 2);
    }

    #[test]
    fn tensor_maps_refuse_what_the_driver_refuses() {
        let refused = |f: fn(&mut TensorMapParams)| {
            let mut p = params();
            f(&mut p);
            matches!(p.encode(), Err(TensorMapError::Invalid(_)))
        };
        assert!(refused(|p| p.global_address += 8));
        assert!(refused(|p| p.global_strides[0] = 24));
        assert!(refused(|p| p.box_dims[1] = 257));
        assert!(refused(|p| p.box_dims[0] = 128)); // 256 bytes > the 128-byte swizzle span
        assert!(refused(|p| p.box_dims[0] = 4)); // 8 bytes, not a multiple of 16
        assert!(refused(|p| p.element_strides[2] = 9));
        assert!(refused(|p| p.rank = 0));
        let mut driver_blob = params().encode().unwrap();
        driver_blob.0[0] = 0x1234;
        assert_eq!(TensorMapParams::decode(&driver_blob), Err(TensorMapError::NotOurEncoding));
    }

    #[test]
    fn descriptors_place_each_field_where_the_isa_does() {
        let d = MatrixDescriptor {
            start: 0x1_2340,
            leading_byte_offset: 16,
            stride_byte_offset: 1024,
            base_offset: 0,
            swizzle: DescriptorSwizzle::B128,
        };
        // start >> 4 = 0x1234 in bits 0-13, LBO 1 in 16-29, SBO 64 in 32-45, swizzle 1 in 62-63.
        assert_eq!(d.encode(), 0x1234 | 1 << 16 | 64 << 32 | 1 << 62);
        assert_eq!(MatrixDescriptor::decode(d.encode()), d);
    }
}
