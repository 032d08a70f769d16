//! `ferrodist-store`: the standalone store server (filled in by the TCPStore work).
fn main() {
    eprintln!("ferrodist-store: the TCP server is not built yet");
    std::process::exit(2);
}
