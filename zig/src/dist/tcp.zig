//! Blocking TCP between the tensor-parallel ranks (IPv4, libc sockets): rank 0 listens, the others
//! connect and say their rank. It carries the step plans, the NCCL unique id, and on the CPU
//! backend the all-reduce itself. Every receive has a timeout, so a dead peer is an error, not a
//! hang.
const std = @import("std");
const c = std.c;
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;

pub const Error = error{ NetworkFailed, PeerClosed, TimedOut, InvalidAddress };

pub const Connection = struct {
    fd: c.fd_t,

    pub fn close(conn: *Connection) void {
        _ = c.close(conn.fd);
        conn.fd = -1;
    }

    pub fn sendAll(conn: *const Connection, bytes: []const u8, diag: *Diagnostic) Error!void {
        var sent: usize = 0;
        while (sent < bytes.len) {
            const n = c.send(conn.fd, bytes[sent..].ptr, bytes.len - sent, msg_nosignal);
            if (n <= 0) {
                diag.set("tensor-parallel peer connection lost while sending ({t})", .{c.errno(n)});
                return error.PeerClosed;
            }
            sent += @intCast(n);
        }
    }

    pub fn recvAll(conn: *const Connection, bytes: []u8, diag: *Diagnostic) Error!void {
        var got: usize = 0;
        while (got < bytes.len) {
            const n = c.recv(conn.fd, bytes[got..].ptr, bytes.len - got, 0);
            if (n == 0) {
                diag.set("tensor-parallel peer closed the connection", .{});
                return error.PeerClosed;
            }
            if (n < 0) {
                const e = c.errno(n);
                if (e == .AGAIN) {
                    diag.set("tensor-parallel peer did not answer within the timeout", .{});
                    return error.TimedOut;
                }
                if (e == .INTR) continue;
                diag.set("tensor-parallel receive failed ({t})", .{e});
                return error.NetworkFailed;
            }
            got += @intCast(n);
        }
    }

    pub fn sendValue(conn: *const Connection, value: anytype, diag: *Diagnostic) Error!void {
        try conn.sendAll(std.mem.asBytes(&value), diag);
    }

    pub fn recvValue(conn: *const Connection, comptime T: type, diag: *Diagnostic) Error!T {
        var value: T = undefined;
        try conn.recvAll(std.mem.asBytes(&value), diag);
        return value;
    }

    pub fn setTimeout(conn: *const Connection, seconds: u32) void {
        const tv: c.timeval = .{ .sec = @intCast(seconds), .usec = 0 };
        _ = c.setsockopt(conn.fd, c.SOL.SOCKET, c.SO.RCVTIMEO, &tv, @sizeOf(c.timeval));
        const one: c_int = 1;
        _ = c.setsockopt(conn.fd, c.IPPROTO.TCP, c.TCP.NODELAY, &one, @sizeOf(c_int));
    }
};

const msg_nosignal: u32 = 0x4000; // MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE

pub fn parseAddress(host: []const u8, port: u16, diag: *Diagnostic) Error!c.sockaddr.in {
    const text = if (std.mem.eql(u8, host, "localhost")) "127.0.0.1" else host;
    var octets: [4]u8 = undefined;
    var it = std.mem.splitScalar(u8, text, '.');
    for (&octets) |*octet| {
        const part = it.next() orelse return badAddress(host, diag);
        octet.* = std.fmt.parseInt(u8, part, 10) catch return badAddress(host, diag);
    }
    if (it.next() != null) return badAddress(host, diag);
    return .{ .port = std.mem.nativeToBig(u16, port), .addr = @bitCast(octets) };
}

fn badAddress(host: []const u8, diag: *Diagnostic) Error {
    diag.set("tensor-parallel master '{s}' is not an IPv4 address (a.b.c.d or localhost)", .{host});
    return error.InvalidAddress;
}

/// Rank 0: listens on `port` and accepts `peers` connections, each opened with its rank (u32);
/// returns them indexed by rank - 1.
pub fn acceptPeers(host: []const u8, port: u16, peers: []Connection, timeout_s: u32, diag: *Diagnostic) Error!void {
    const address = try parseAddress(host, port, diag);
    const listener = c.socket(c.AF.INET, c.SOCK.STREAM, 0);
    if (listener < 0) {
        diag.set("cannot open a socket for the tensor-parallel master", .{});
        return error.NetworkFailed;
    }
    defer _ = c.close(listener);
    const one: c_int = 1;
    _ = c.setsockopt(listener, c.SOL.SOCKET, c.SO.REUSEADDR, &one, @sizeOf(c_int));
    if (c.bind(listener, @ptrCast(&address), @sizeOf(c.sockaddr.in)) != 0 or c.listen(listener, 16) != 0) {
        diag.set("cannot listen on {s}:{d} for tensor-parallel ranks ({t})", .{ host, port, c.errno(-1) });
        return error.NetworkFailed;
    }
    const tv: c.timeval = .{ .sec = @intCast(timeout_s), .usec = 0 };
    _ = c.setsockopt(listener, c.SOL.SOCKET, c.SO.RCVTIMEO, &tv, @sizeOf(c.timeval));
    for (peers) |*p| p.* = .{ .fd = -1 };
    errdefer for (peers) |*p| if (p.fd >= 0) p.close();
    var accepted: usize = 0;
    while (accepted < peers.len) {
        const fd = c.accept(listener, null, null);
        if (fd < 0) {
            diag.set("only {d} of {d} tensor-parallel ranks connected to {s}:{d} within {d} s", .{ accepted + 1, peers.len + 1, host, port, timeout_s });
            return error.TimedOut;
        }
        var conn: Connection = .{ .fd = fd };
        conn.setTimeout(timeout_s);
        const rank = conn.recvValue(u32, diag) catch {
            conn.close();
            continue;
        };
        if (rank == 0 or rank > peers.len or peers[rank - 1].fd >= 0) {
            diag.set("a peer announced rank {d}, which is not expected", .{rank});
            conn.close();
            return error.NetworkFailed;
        }
        peers[rank - 1] = conn;
        accepted += 1;
    }
}

/// Rank > 0: connects to the master, retrying until `timeout_s`, and announces its rank.
pub fn connectToMaster(host: []const u8, port: u16, rank: u32, timeout_s: u32, diag: *Diagnostic) Error!Connection {
    const address = try parseAddress(host, port, diag);
    var waited_ms: u64 = 0;
    while (true) {
        const fd = c.socket(c.AF.INET, c.SOCK.STREAM, 0);
        if (fd < 0) return error.NetworkFailed;
        if (c.connect(fd, @ptrCast(&address), @sizeOf(c.sockaddr.in)) == 0) {
            var conn: Connection = .{ .fd = fd };
            conn.setTimeout(timeout_s);
            try conn.sendValue(rank, diag);
            return conn;
        }
        _ = c.close(fd);
        if (waited_ms >= @as(u64, timeout_s) * 1000) {
            diag.set("cannot reach the tensor-parallel master at {s}:{d} within {d} s", .{ host, port, timeout_s });
            return error.TimedOut;
        }
        const pause: c.timespec = .{ .sec = 0, .nsec = 100 * std.time.ns_per_ms };
        _ = c.nanosleep(&pause, null);
        waited_ms += 100;
    }
}
