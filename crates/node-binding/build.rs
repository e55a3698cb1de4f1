//! Sets the linker flags a Node.js addon needs (symbols resolved by the host process).

fn main() {
    napi_build::setup();
}
