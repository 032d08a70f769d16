//! Bucket assignment on torch's documented cases (torch 2.13 outputs; see
//! shared/design/torch-semantics.md 2.3) and on the inputs torch crashes on.

use ferrodist::bucket::{assign_buckets, BucketAssignment, BucketRequest, GroupKey};
use ferrodist::Error;

const F32: GroupKey = GroupKey {
    dtype: 6,
    device: 255,
};
const F16: GroupKey = GroupKey {
    dtype: 5,
    device: 255,
};

fn assign(
    sizes: &[u64],
    keys: &[GroupKey],
    limits: &[u64],
    sparse: &[bool],
    indices: &[i64],
) -> Result<BucketAssignment, Error> {
    assign_buckets(&BucketRequest {
        sizes,
        keys,
        limits,
        expect_sparse_gradient: sparse,
        tensor_indices: indices,
    })
}

fn buckets(b: &[&[u64]], limits: &[u64]) -> BucketAssignment {
    BucketAssignment {
        buckets: b.iter().map(|x| x.to_vec()).collect(),
        size_limits: limits.to_vec(),
    }
}

#[test]
fn limits_are_walked_per_group_and_the_last_repeats() {
    let got = assign(&[120; 4], &[F32; 4], &[100, 1000], &[], &[]).unwrap();
    assert_eq!(got, buckets(&[&[0], &[1, 2, 3]], &[100, 1000]));
    let got = assign(&[40; 4], &[F32; 4], &[40, 80], &[], &[]).unwrap();
    assert_eq!(got, buckets(&[&[0], &[1, 2], &[3]], &[40, 80, 80]));
    let mixed = [F32, F16, F32, F16, F32];
    let got = assign(&[400, 50, 400, 50, 4], &mixed, &[10, 500], &[], &[]).unwrap();
    assert_eq!(
        got,
        buckets(&[&[0], &[1], &[2, 4], &[3]], &[10, 10, 500, 500])
    );
}

#[test]
fn zero_limit_gives_one_bucket_per_tensor() {
    let got = assign(&[40; 4], &[F32; 4], &[0], &[], &[]).unwrap();
    assert_eq!(got, buckets(&[&[0], &[1], &[2], &[3]], &[0, 0, 0, 0]));
}

#[test]
fn sparse_gradients_get_their_own_bucket_indexed_by_tensor_index() {
    let sparse = [false, true, false, false];
    let got = assign(&[40; 4], &[F32; 4], &[1000], &sparse, &[]).unwrap();
    assert_eq!(got, buckets(&[&[0, 2, 3], &[1]], &[1000, 0]));
    let got = assign(&[40; 4], &[F32; 4], &[1000], &sparse, &[3, 1, 0, 2]).unwrap();
    assert_eq!(got, buckets(&[&[1], &[3, 0, 2]], &[0, 1000]));
}

#[test]
fn given_order_is_kept_and_leftovers_follow_torchs_map_order() {
    let keys = [F32, F16, F32, F16];
    let got = assign(&[40, 20, 40, 20], &keys, &[30, 1000], &[], &[3, 2, 1, 0]).unwrap();
    assert_eq!(got, buckets(&[&[3], &[2, 0], &[1]], &[30, 30, 1000]));
    // float16 was inserted second but comes out first, as in torch.
    let got = assign(&[40, 20, 40, 20], &keys, &[1000], &[], &[0, 1, 2, 3]).unwrap();
    assert_eq!(got, buckets(&[&[1, 3], &[0, 2]], &[1000, 1000]));
}

#[test]
fn inputs_torch_crashes_on_are_errors_naming_the_argument() {
    let err = |r: Result<BucketAssignment, Error>| r.unwrap_err().to_string();
    assert!(err(assign(&[], &[], &[10], &[], &[])).contains("tensors"));
    assert!(err(assign(&[4], &[F32], &[], &[], &[])).contains("bucket_size_limits"));
    assert!(err(assign(&[4, 4], &[F32; 2], &[10], &[true], &[])).contains("expect_sparse"));
    assert!(err(assign(&[4, 4], &[F32; 2], &[10], &[], &[0])).contains("tensor_indices"));
    assert!(err(assign(&[4, 4], &[F32; 2], &[10], &[], &[0, 2])).contains("out of range"));
    assert!(err(assign(&[4, 4], &[F32; 2], &[10], &[], &[-1, 0])).contains("out of range"));
    assert!(err(assign(&[4, 4], &[F32; 2], &[10], &[], &[1, 1])).contains("repeats"));
}

#[test]
fn tensor_sizes_follow_torchs_layout_rules() {
    use ferrodist::bucket::{tensor_bytes, TensorSize};
    assert_eq!(tensor_bytes(0, TensorSize::Bytes(24)).unwrap(), 24);
    let csr = TensorSize::OtherSparse {
        numel: 16,
        element_size: 4,
    };
    assert_eq!(tensor_bytes(1, csr).unwrap(), 64);
    let err = tensor_bytes(3, TensorSize::SparseCoo).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "No support for sparse tensors. (tensors[3] is sparse)"
    );
}
