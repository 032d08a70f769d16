//! The store engine's ops in-process (criterion), for what the map's layout costs per op:
//! small keys and values arrive as slices of a copied request frame, as the server decodes
//! them, and large values as their own shared buffer.
//!
//! Run: `cargo bench --bench store_db` (add `-- --quick` for a short run).

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use ferrodist::store::db::Db;

const KEYS: usize = 10_000;

/// A SET frame's key and value the way the server gets them: slices of one copied frame.
fn framed(i: usize) -> (Bytes, Bytes) {
    let frame = Bytes::from(format!("/key-{i:012}{i:08}"));
    (frame.slice(..17), frame.slice(17..))
}

fn key(i: usize) -> Vec<u8> {
    format!("/key-{i:012}").into_bytes()
}

fn ops(c: &mut Criterion) {
    let db = Db::new();
    for i in 0..KEYS {
        let (k, v) = framed(i);
        db.set(k, v);
    }
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let mut i = 0;
    c.bench_function("set small (frame copy included)", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            let (k, v) = framed(i);
            db.set(k, v)
        })
    });
    c.bench_function("get small", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(db.get(&keys[i]))
        })
    });
    c.bench_function("add", |b| {
        b.iter(|| black_box(db.add(b"/counter", 1).unwrap()))
    });
    let hundred: Vec<Bytes> = (0..100).map(|i| Bytes::from(key(i))).collect();
    c.bench_function("multi_get 100 small", |b| {
        b.iter(|| black_box(db.multi_get(&hundred)))
    });
    c.bench_function("check 100", |b| b.iter(|| black_box(db.check(&hundred))));
    db.set(Bytes::from_static(b"/big"), Bytes::from(vec![7u8; 1 << 20]));
    c.bench_function("get 1 MiB", |b| b.iter(|| black_box(db.get(b"/big"))));
}

criterion_group!(benches, ops);
criterion_main!(benches);
