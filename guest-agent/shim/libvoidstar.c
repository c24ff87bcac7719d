/*
 * detvisor's libvoidstar.so: what the Antithesis SDKs dlopen() at
 * /usr/lib/libvoidstar.so, with their exact C signatures. It carries what a
 * guest program reports to detvisor's in-guest agent over a Unix stream
 * socket, /run/detvisor/sdk.sock (in a node: that node's own socket, which
 * the agent bind-mounts into the node's mount namespace; so the agent knows
 * which node wrote each record).
 *
 * No libc: built with -nostdlib -ffreestanding, system calls by inline asm
 * (x86-64), so the same file loads in glibc and musl images. No TLS, no
 * constructors, no allocation.
 *
 * Wire format (one frame per call; the agent's sdk.rs decodes it):
 *   u32 little-endian length of what follows (kind byte + payload)
 *   u8  kind: 1 = a JSON record (payload: its bytes, no newline)
 *             2 = flush (no payload)
 *             3 = random request (no payload); the agent answers 8 bytes,
 *                 a little-endian u64 from the explorer's seeded stream.
 * Payloads are at most SHIM_MAX_PAYLOAD bytes; a longer record is dropped
 * here (the agent would close the connection).
 *
 * Without the agent (no socket, connection refused or broken): records are
 * dropped, fuzz_flush does nothing and fuzz_get_random returns 8 bytes of
 * getrandom(2) (the guest kernel's CRNG, itself seeded by detvisor), so a
 * caller never crashes or blocks.
 *
 * Coverage (init_coverage_module, notify_coverage) is accepted and not used:
 * init_coverage_module returns consecutive offsets (the module's first edge
 * index, as the Go instrumentor expects), notify_coverage always returns 0
 * ("nothing new"), since nothing records coverage yet.
 */

typedef unsigned long size_t;
typedef long ssize_t;
typedef unsigned long long uint64_t;
typedef unsigned int uint32_t;
typedef unsigned char uint8_t;
typedef _Bool bool;

#define SYS_read 0
#define SYS_write 1
#define SYS_close 3
#define SYS_sched_yield 24
#define SYS_getpid 39
#define SYS_socket 41
#define SYS_connect 42
#define SYS_getrandom 318

#define AF_UNIX 1
#define SOCK_STREAM 1
#define SOCK_CLOEXEC 02000000
#define EINTR 4

#define SHIM_MAX_PAYLOAD (128u << 10) /* sdk.rs MAX_RECORD_LEN */
#define KIND_JSON 1
#define KIND_FLUSH 2
#define KIND_RANDOM 3

static const char SOCKET_PATH[] = "/run/detvisor/sdk.sock";

static long sys3(long n, long a, long b, long c) {
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c)
			 : "rcx", "r11", "memory");
	return ret;
}

/* The connection: -1 when not connected; `owner` is the process that made it
 * (a forked child must not share its parent's conversation). */
static int conn_fd = -1;
static long conn_owner;
/* One caller at a time (threads); a spin lock that yields. */
static volatile int lock_word;

static void lock(void) {
	while (__atomic_exchange_n(&lock_word, 1, __ATOMIC_ACQUIRE))
		sys3(SYS_sched_yield, 0, 0, 0);
}

static void unlock(void) { __atomic_store_n(&lock_word, 0, __ATOMIC_RELEASE); }

static void disconnect(void) {
	if (conn_fd >= 0)
		sys3(SYS_close, conn_fd, 0, 0);
	conn_fd = -1;
}

struct sockaddr_un {
	unsigned short sun_family;
	char sun_path[108];
};

/* Connected to the agent, (re)connecting if needed; 0 on success. */
static int ensure_connected(void) {
	long pid = sys3(SYS_getpid, 0, 0, 0);
	if (conn_fd >= 0 && conn_owner == pid)
		return 0;
	if (conn_fd >= 0 && conn_owner != pid) {
		/* Inherited across fork: the parent's. Close our copy only. */
		sys3(SYS_close, conn_fd, 0, 0);
		conn_fd = -1;
	}
	long fd = sys3(SYS_socket, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_un addr;
	addr.sun_family = AF_UNIX;
	size_t i = 0;
	for (; SOCKET_PATH[i]; i++)
		addr.sun_path[i] = SOCKET_PATH[i];
	for (; i < sizeof addr.sun_path; i++)
		addr.sun_path[i] = 0;
	long r;
	do
		r = sys3(SYS_connect, fd, (long)&addr, sizeof addr);
	while (r == -EINTR);
	if (r < 0) {
		sys3(SYS_close, fd, 0, 0);
		return -1;
	}
	conn_fd = (int)fd;
	conn_owner = pid;
	return 0;
}

static int write_all(const uint8_t *p, size_t n) {
	while (n) {
		long w = sys3(SYS_write, conn_fd, (long)p, (long)n);
		if (w == -EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int read_all(uint8_t *p, size_t n) {
	while (n) {
		long r = sys3(SYS_read, conn_fd, (long)p, (long)n);
		if (r == -EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int send_frame(uint8_t kind, const uint8_t *payload, size_t len) {
	uint8_t header[5];
	uint32_t total = (uint32_t)len + 1;
	header[0] = total & 0xff;
	header[1] = (total >> 8) & 0xff;
	header[2] = (total >> 16) & 0xff;
	header[3] = (total >> 24) & 0xff;
	header[4] = kind;
	if (write_all(header, sizeof header) < 0)
		return -1;
	if (len && write_all(payload, len) < 0)
		return -1;
	return 0;
}

/* Sends one frame, reconnecting once if the connection had broken. */
static int send_with_retry(uint8_t kind, const uint8_t *payload, size_t len) {
	for (int attempt = 0; attempt < 2; attempt++) {
		if (ensure_connected() < 0)
			return -1;
		if (send_frame(kind, payload, len) == 0)
			return 0;
		disconnect();
	}
	return -1;
}

__attribute__((visibility("default"))) void fuzz_json_data(const char *data, size_t size) {
	if (!data || size > SHIM_MAX_PAYLOAD)
		return;
	lock();
	send_with_retry(KIND_JSON, (const uint8_t *)data, size);
	unlock();
}

__attribute__((visibility("default"))) void fuzz_flush(void) {
	/* Records are written at once; the frame tells the agent to forward
	 * what it holds now. */
	lock();
	if (conn_fd >= 0)
		send_with_retry(KIND_FLUSH, 0, 0);
	unlock();
}

__attribute__((visibility("default"))) uint64_t fuzz_get_random(void) {
	uint8_t bytes[8];
	int ok = 0;
	lock();
	for (int attempt = 0; attempt < 2 && !ok; attempt++) {
		if (ensure_connected() < 0)
			break;
		if (send_frame(KIND_RANDOM, 0, 0) == 0 && read_all(bytes, 8) == 0)
			ok = 1;
		else
			disconnect();
	}
	unlock();
	if (!ok) {
		/* No agent: the guest kernel's CRNG (detvisor seeds it). */
		long got = 0;
		while (got < 8) {
			long r = sys3(SYS_getrandom, (long)(bytes + got), 8 - got, 0);
			if (r == -EINTR)
				continue;
			if (r <= 0)
				return 0;
			got += r;
		}
	}
	uint64_t value = 0;
	for (int i = 7; i >= 0; i--)
		value = (value << 8) | bytes[i];
	return value;
}

static size_t next_coverage_offset;

__attribute__((visibility("default"))) size_t init_coverage_module(size_t edge_count,
								   const char *symbol_file_name) {
	(void)symbol_file_name;
	size_t offset = __atomic_fetch_add(&next_coverage_offset, edge_count, __ATOMIC_RELAXED);
	return offset;
}

__attribute__((visibility("default"))) bool notify_coverage(size_t edge_plus_module) {
	(void)edge_plus_module;
	return 0;
}
