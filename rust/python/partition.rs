//! Binding for [`crate::partition`]: ZeRO's sorted-greedy parameter partition.

use pyo3::prelude::*;

use super::errors::to_py;
use crate::partition;

/// Partitions parameters across ranks the way `ZeroRedundancyOptimizer` does.
///
/// Args:
///     group_sizes (list[list[int]]): element count of each parameter, per parameter group.
///     world_size (int): number of ranks.
///
/// Returns:
///     list[list[list[int]]]: for each group, for each rank, the in-group parameter indices
///     assigned to that rank, largest first.
#[pyfunction]
pub fn sorted_greedy_partition(
    group_sizes: Vec<Vec<u64>>,
    world_size: usize,
) -> PyResult<Vec<Vec<Vec<usize>>>> {
    partition::sorted_greedy_partition(&group_sizes, world_size).map_err(to_py)
}

/// Assigns DDP gradient buckets (or contiguous slices of them) to ranks for ZeRO overlap mode.
///
/// Args:
///     bucket_sizes (list[list[int]]): element count of each parameter, per DDP bucket.
///     world_size (int): number of ranks.
///     shard_buckets (bool): cut buckets into slices spread over several ranks.
///
/// Returns:
///     list[tuple[int, int, int, int]]: `(bucket, rank, offset, length)` per slice, in
///     assignment order.
///
/// Raises:
///     AssertionError: an empty bucket, or a bucket that cannot be cut among the ranks (torch's
///         class for both).
#[pyfunction]
pub fn assign_ddp_buckets(
    bucket_sizes: Vec<Vec<u64>>,
    world_size: usize,
    shard_buckets: bool,
) -> PyResult<Vec<(usize, usize, usize, usize)>> {
    let slices =
        partition::assign_ddp_buckets(&bucket_sizes, world_size, shard_buckets).map_err(to_py)?;
    Ok(slices
        .into_iter()
        .map(|s| (s.bucket, s.rank, s.offset, s.len))
        .collect())
}
