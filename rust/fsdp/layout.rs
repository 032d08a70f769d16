//! The flat-parameter layout of torch's FSDP (`FlatParamHandle`), planned from element counts.
//!
//! FSDP concatenates the parameters of one wrapped module into a single 1-D "flat parameter"
//! and gives each rank an equal-sized contiguous shard of it. Every rank must agree on where
//! each parameter lies, where the padding goes and which parameter slices its shard covers, and
//! all of that follows from the parameters' element counts, the dtype's size and the world size.
//! Planning it here, without tensors, lets ferrodist's runtime and its memory estimate share one
//! answer that is tested against torch's own handle.
//!
//! torch's rules (2.13, `_flat_param.py`), which this module reproduces exactly:
//!
//! * With address alignment (torch turns it on exactly when `use_orig_params=True`), each
//!   parameter starts at a multiple of `16 / itemsize` elements: a padding segment is inserted
//!   before a parameter whose start would not be aligned. The flat parameter is then padded at
//!   the end to a multiple of the world size. An itemsize above 16 bytes gives an alignment of 0
//!   elements, which torch treats as "no alignment" (and then adds no world-size padding either).
//! * Sharding is `flat.chunk(world_size)`: chunks of `ceil(numel / world_size)` elements, the
//!   last one shorter, and ranks past the last chunk get an empty one. Every rank pads its chunk
//!   at the end to the first chunk's size, so all shards have the same numel.
//! * A rank's shard info is computed against the padded shard's index range
//!   `[shard_numel * rank, shard_numel * (rank + 1) - 1]`, which may run past the flat
//!   parameter's end. A zero-numel parameter spans the empty interval `[p, p - 1]`; it counts as
//!   in a shard when `p - 1 >= start` and `p <= end`, with an inclusive intra-parameter end of -1
//!   and a numel in shard of 0, as torch computes it.

use crate::error::{Error, Result};

/// torch's address alignment for flat-parameter segments, in bytes (a TorchInductor constraint).
pub const ALIGNMENT_BYTES: u64 = 16;

/// Where one original parameter lies in a rank's shard (torch's `_ShardParamInfo` when
/// `in_shard` is true).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSlice {
    /// Index of the parameter's first element held here, within the sharded flat parameter.
    pub offset_in_shard: u64,
    /// Number of the parameter's elements this shard holds.
    pub numel_in_shard: u64,
    /// First element held, as an index into the flattened parameter.
    pub intra_param_start_idx: u64,
    /// Last element held (inclusive), as an index into the flattened parameter; -1 for a
    /// zero-numel parameter, as torch computes it.
    pub intra_param_end_idx: i64,
}

/// The layout of one flat parameter across `world_size` ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatParamLayout {
    /// Number of ranks the flat parameter is sharded over.
    pub world_size: u64,
    /// Element count of each original parameter, in flattening order.
    pub numels: Vec<u64>,
    /// Where each original parameter starts in the unsharded flat parameter.
    pub param_offsets: Vec<u64>,
    /// Parameters and padding segments in order (torch's `_numels_with_padding`).
    pub numels_with_padding: Vec<u64>,
    /// True for the padding segments of `numels_with_padding` (torch's `_is_padding_mask`).
    pub is_padding_mask: Vec<bool>,
    /// Element count of the unsharded flat parameter, padding included.
    pub flat_numel: u64,
    /// Element count of every rank's shard, end padding included (torch's sharded size).
    pub shard_numel: u64,
}

/// Plans the flat parameter of parameters with element counts `numels` (in the order torch
/// flattens them: the wrapped module's `named_modules()` walk, shared parameters once), stored
/// in a dtype of `itemsize` bytes, sharded over `world_size` ranks.
///
/// `align_addresses` is torch's `use_orig_params`; `itemsize` is then the size of the dtype
/// the parameters have in forward and backward (the mixed-precision `param_dtype` if set).
/// Arguments are signed so that a negative value is reported by name rather than wrapped.
pub fn plan_flat_param(
    numels: &[i64],
    itemsize: i64,
    world_size: i64,
    align_addresses: bool,
) -> Result<FlatParamLayout> {
    let numels = counts(numels)?;
    let world_size = positive("world_size", world_size)?;
    let itemsize = positive("itemsize", itemsize)?;
    let aligned_numel = if align_addresses {
        ALIGNMENT_BYTES / itemsize
    } else {
        0
    };
    let mut numels_with_padding = Vec::with_capacity(numels.len() * 2 + 1);
    let mut is_padding_mask = Vec::with_capacity(numels.len() * 2 + 1);
    let mut param_offsets = Vec::with_capacity(numels.len());
    let mut total = 0u64;
    for &numel in &numels {
        if aligned_numel > 0 {
            let misalignment = total % aligned_numel;
            if misalignment != 0 {
                numels_with_padding.push(aligned_numel - misalignment);
                is_padding_mask.push(true);
                total += aligned_numel - misalignment;
            }
        }
        param_offsets.push(total);
        numels_with_padding.push(numel);
        is_padding_mask.push(false);
        total += numel;
    }
    if total == 0 {
        return Err(Error::InvalidArgument(
            "numels: the parameters hold no elements; torch's FSDP cannot shard an empty flat \
             parameter"
                .to_string(),
        ));
    }
    if aligned_numel > 0 && !total.is_multiple_of(world_size) {
        let padding = world_size - total % world_size;
        numels_with_padding.push(padding);
        is_padding_mask.push(true);
        total += padding;
    }
    Ok(FlatParamLayout {
        world_size,
        numels,
        param_offsets,
        numels_with_padding,
        is_padding_mask,
        flat_numel: total,
        shard_numel: total.div_ceil(world_size),
    })
}

impl FlatParamLayout {
    /// Element count of the all-gathered flat parameter (every shard, padding included).
    pub fn padded_unsharded_numel(&self) -> u64 {
        self.shard_numel * self.world_size
    }

    /// The `[start, end)` range of the flat parameter that `rank` holds before its end padding
    /// (torch's chunk `rank`, empty for ranks past the last chunk).
    pub fn shard_range(&self, rank: i64) -> Result<(u64, u64)> {
        let rank = self.rank(rank)?;
        let start = (self.shard_numel * rank).min(self.flat_numel);
        let end = (start + self.shard_numel).min(self.flat_numel);
        Ok((start, end))
    }

    /// Number of elements `rank` pads at the end of its shard (torch's `_shard_numel_padded`).
    pub fn shard_padding(&self, rank: i64) -> Result<u64> {
        let (start, end) = self.shard_range(rank)?;
        Ok(self.shard_numel - (end - start))
    }

    /// torch's `_shard_param_infos` for `rank` under a sharded strategy: one entry per original
    /// parameter, `None` where the parameter has no part in the rank's shard.
    pub fn shard_param_infos(&self, rank: i64) -> Result<Vec<Option<ShardSlice>>> {
        let rank = self.rank(rank)?;
        let start = self.shard_numel * rank;
        Ok(self.param_infos_within(start, start + self.shard_numel - 1))
    }

    /// torch's `_shard_param_infos` under `NO_SHARD`, where each rank keeps the whole flat
    /// parameter: every parameter lies in the one "shard" `[0, flat_numel - 1]`.
    pub fn unsharded_param_infos(&self) -> Vec<Option<ShardSlice>> {
        self.param_infos_within(0, self.flat_numel - 1)
    }

    /// Shard info of every original parameter for the inclusive flat range `[start, end]`.
    fn param_infos_within(&self, start: u64, end: u64) -> Vec<Option<ShardSlice>> {
        // Signed: a zero-numel parameter at `p` spans `[p, p - 1]`, and `p` may be 0.
        let (start, end) = (start as i64, end as i64);
        self.param_offsets
            .iter()
            .zip(&self.numels)
            .map(|(&offset, &numel)| {
                let param_start = offset as i64;
                let param_end = param_start + numel as i64 - 1;
                if start > param_end || end < param_start {
                    return None;
                }
                let (intra_start, offset_in_shard) = if start <= param_start {
                    (0, param_start - start)
                } else {
                    (start - param_start, 0)
                };
                let intra_end = param_end.min(end) - param_start;
                Some(ShardSlice {
                    offset_in_shard: offset_in_shard as u64,
                    numel_in_shard: (intra_end - intra_start + 1) as u64,
                    intra_param_start_idx: intra_start as u64,
                    intra_param_end_idx: intra_end,
                })
            })
            .collect()
    }

    /// Checks that `rank` names one of the ranks.
    fn rank(&self, rank: i64) -> Result<u64> {
        u64::try_from(rank)
            .ok()
            .filter(|&r| r < self.world_size)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "rank: {rank} is not in [0, {}) for world_size {}",
                    self.world_size, self.world_size
                ))
            })
    }
}

/// Element counts: at least one, none negative.
fn counts(numels: &[i64]) -> Result<Vec<u64>> {
    if numels.is_empty() {
        return Err(Error::InvalidArgument(
            "numels: a flat parameter needs at least one parameter (torch: \"Cannot construct a \
             FlatParamHandle with an empty parameter list\")"
                .to_string(),
        ));
    }
    numels
        .iter()
        .enumerate()
        .map(|(i, &numel)| {
            u64::try_from(numel)
                .map_err(|_| Error::InvalidArgument(format!("numels[{i}] = {numel} is negative")))
        })
        .collect()
}

/// A count that must be at least 1.
fn positive(name: &str, value: i64) -> Result<u64> {
    u64::try_from(value)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| Error::InvalidArgument(format!("{name} must be at least 1, got {value}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_chunks_leave_trailing_ranks_empty() {
        // 5 elements on 4 ranks: chunks of 2, 2, 1 and none.
        let layout = plan_flat_param(&[5], 4, 4, false).unwrap();
        assert_eq!(layout.shard_numel, 2);
        let ranges: Vec<_> = (0..4).map(|r| layout.shard_range(r).unwrap()).collect();
        assert_eq!(ranges, vec![(0, 2), (2, 4), (4, 5), (5, 5)]);
        let padding: Vec<_> = (0..4).map(|r| layout.shard_padding(r).unwrap()).collect();
        assert_eq!(padding, vec![0, 0, 1, 2]);
        assert_eq!(layout.shard_param_infos(3).unwrap(), vec![None]);
    }

    #[test]
    fn aligned_layout_pads_before_misaligned_params_and_to_the_world_size() {
        // float32: 4-element alignment. 15 | pad 1 | 0 | 7 | pad 1 (to a multiple of 4).
        let layout = plan_flat_param(&[15, 0, 7], 4, 4, true).unwrap();
        assert_eq!(layout.numels_with_padding, vec![15, 1, 0, 7, 1]);
        assert_eq!(
            layout.is_padding_mask,
            vec![false, true, false, false, true]
        );
        assert_eq!(layout.param_offsets, vec![0, 16, 16]);
        assert_eq!((layout.flat_numel, layout.shard_numel), (24, 6));
        let infos = layout.shard_param_infos(0).unwrap();
        assert_eq!(
            infos[0],
            Some(ShardSlice {
                offset_in_shard: 0,
                numel_in_shard: 6,
                intra_param_start_idx: 0,
                intra_param_end_idx: 5
            })
        );
        assert_eq!(infos[1..], [None, None]);
    }

    #[test]
    fn zero_numel_param_inside_a_shard_has_torchs_empty_slice() {
        // Shards [0, 2] and [3, 5]; the empty parameter at 4 spans [4, 3], which meets rank 1's
        // shard only; at 3 it would span [3, 2] and meet neither.
        let layout = plan_flat_param(&[4, 0, 2], 4, 2, false).unwrap();
        assert_eq!(layout.shard_param_infos(0).unwrap()[1], None);
        assert_eq!(
            layout.shard_param_infos(1).unwrap()[1],
            Some(ShardSlice {
                offset_in_shard: 1,
                numel_in_shard: 0,
                intra_param_start_idx: 0,
                intra_param_end_idx: -1
            })
        );
    }

    #[test]
    fn bad_arguments_are_named() {
        let message = |r: Result<FlatParamLayout>| r.unwrap_err().to_string();
        assert!(message(plan_flat_param(&[], 4, 2, false)).starts_with("numels"));
        assert!(message(plan_flat_param(&[0, 0], 4, 2, false)).starts_with("numels"));
        assert!(message(plan_flat_param(&[1, -1], 4, 2, false)).starts_with("numels[1]"));
        assert!(message(plan_flat_param(&[1], 0, 2, false)).starts_with("itemsize"));
        assert!(message(plan_flat_param(&[1], 4, 0, false)).starts_with("world_size"));
        let layout = plan_flat_param(&[4], 4, 2, false).unwrap();
        assert!(layout
            .shard_range(2)
            .unwrap_err()
            .to_string()
            .starts_with("rank"));
        assert!(layout.shard_range(-1).is_err());
    }
}
