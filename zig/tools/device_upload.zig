//! The tools' one way to put host bytes on the GPU: a fresh buffer holding them (the caller frees it),
//! or, for a suite case's many inputs, `Uploads`, which frees them all at once.
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Diagnostic = tf.core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;

pub fn upload(gpu: *cuda.Gpu, bytes: []const u8, diag: *Diagnostic) !Ptr {
    const ptr = try gpu.alloc(bytes.len, diag);
    errdefer gpu.free(ptr);
    try gpu.upload(ptr, bytes, diag);
    return ptr;
}

/// Up to 16 uploaded slices, freed together by deinit.
pub const Uploads = struct {
    gpu: *cuda.Gpu,
    diag: *Diagnostic,
    ptrs: [16]Ptr = undefined,
    count: usize = 0,

    /// A device copy of `slice` (any element type), freed by deinit.
    pub fn put(u: *Uploads, slice: anytype) !Ptr {
        if (u.count == u.ptrs.len) return error.TooManyUploads; // a release build would not assert
        const ptr = try upload(u.gpu, std.mem.sliceAsBytes(slice), u.diag);
        u.ptrs[u.count] = ptr;
        u.count += 1;
        return ptr;
    }

    pub fn deinit(u: *Uploads) void {
        for (u.ptrs[0..u.count]) |ptr| u.gpu.free(ptr);
    }
};
