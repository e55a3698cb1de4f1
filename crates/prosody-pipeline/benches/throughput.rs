//! Throughput benchmark (being written).
fn main() {}
