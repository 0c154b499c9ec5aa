//! The tools' one way to put host bytes on the GPU: a fresh buffer holding them (the caller frees it).
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Diagnostic = tf.core.Diagnostic;

pub fn upload(gpu: *cuda.Gpu, bytes: []const u8, diag: *Diagnostic) !cuda.gpu.DevicePtr {
    const ptr = try gpu.alloc(bytes.len, diag);
    errdefer gpu.free(ptr);
    try gpu.upload(ptr, bytes, diag);
    return ptr;
}
