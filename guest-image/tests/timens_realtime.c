/*
 * Checks patches/0003 (a time namespace's CLOCK_REALTIME offset and rate,
 * changeable at run time) from inside the guest: run as the guest's command
 * by test-timens.sh.  Prints what it sees and exits 0 if all is as expected.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL: " __VA_ARGS__); printf("\n"); failures++; } } while (0)

static long long ns(clockid_t c)
{
	struct timespec t;

	clock_gettime(c, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long ms(void) { return ns(CLOCK_MONOTONIC) / 1000000; }

/* One line to /proc/self/timens_realtime: 0 or -errno. */
static int put(const char *line)
{
	int fd = open("/proc/self/timens_realtime", O_WRONLY), r, e;

	if (fd < 0)
		return -errno;
	r = write(fd, line, strlen(line));
	e = errno;
	close(fd);
	return r < 0 ? -e : 0;
}

/* Every realtime reader agrees with CLOCK_REALTIME, to the second. */
static long long real_s(const char *what)
{
	struct timeval tv;
	long long real = ns(CLOCK_REALTIME) / 1000000000LL;
	long long coarse = ns(CLOCK_REALTIME_COARSE) / 1000000000LL;
	long long t = time(NULL);

	gettimeofday(&tv, NULL);
	printf("%s: real %lld tod %ld time %lld coarse %lld\n", what, real,
	       (long)tv.tv_sec, t, coarse);
	CHECK(llabs(tv.tv_sec - real) <= 1 && llabs(t - real) <= 1 &&
	      llabs(coarse - real) <= 1, "%s: the readers disagree", what);
	return real;
}

static struct timespec real_in(long long msec)
{
	long long t = ns(CLOCK_REALTIME) + msec * 1000000LL;
	struct timespec s = { t / 1000000000LL, t % 1000000000LL };

	return s;
}

static void waited(const char *what, long long start, long long want)
{
	long long got = ms() - start;

	printf("%s: waited %lld ms (deadline %lld ms ahead)\n", what, got, want);
	CHECK(got >= want - 5 && got < want + 150, "%s waited %lld ms", what, got);
}

/* Absolute CLOCK_REALTIME deadlines `msec` ahead in the namespace's view
 * (`mono_ms` of monotonic time away). */
static void deadlines(long long msec, long long mono_ms)
{
	sigset_t set;
	struct sigevent ev = { .sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGUSR1 };
	pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t c = PTHREAD_COND_INITIALIZER;
	struct itimerspec its = { { 0, 0 }, { 0, 0 } };
	struct timespec d;
	uint64_t n;
	timer_t tm;
	int fd, sig, word = 0;
	long long s;

	d = real_in(msec);
	s = ms();
	clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &d, NULL);
	waited("clock_nanosleep", s, mono_ms);

	fd = timerfd_create(CLOCK_REALTIME, 0);
	its.it_value = real_in(msec);
	s = ms();
	timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, NULL);
	if (read(fd, &n, sizeof n) != sizeof n)
		failures++;
	close(fd);
	waited("timerfd", s, mono_ms);

	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, NULL);
	timer_create(CLOCK_REALTIME, &ev, &tm);
	its.it_value = real_in(msec);
	s = ms();
	timer_settime(tm, TIMER_ABSTIME, &its, NULL);
	sigwait(&set, &sig);
	timer_delete(tm);
	waited("timer_settime", s, mono_ms);

	d = real_in(msec);
	s = ms();
	pthread_mutex_lock(&m);
	pthread_cond_timedwait(&c, &m, &d);
	pthread_mutex_unlock(&m);
	waited("pthread_cond_timedwait", s, mono_ms);

	d = real_in(msec);
	s = ms();
	syscall(SYS_futex, &word, FUTEX_WAIT_BITSET | FUTEX_CLOCK_REALTIME, 0,
		&d, NULL, FUTEX_BITSET_MATCH_ANY);
	waited("FUTEX_CLOCK_REALTIME", s, mono_ms);
}

int main(void)
{
	long long host, r0, r1, m0, m1;
	struct timespec second = { 1, 0 };
	pid_t pid;
	int status;

	CHECK(put("step 1\n") == -EINVAL, "the initial namespace took an offset");
	if (unshare(CLONE_NEWTIME)) {
		perror("unshare(CLONE_NEWTIME)");
		return 1;
	}
	pid = fork();
	if (pid) {
		waitpid(pid, &status, 0);
		host = real_s("parent, initial namespace");
		(void)host;
		printf("%s\n", WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "timens_realtime: OK" : "timens_realtime: FAILED");
		return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
	}
	/* The child is in the new namespace; its /proc/self file is its own. */
	r0 = real_s("start");
	CHECK(put("step 30000000000\n") == 0, "step +30s");
	r1 = real_s("after step +30s");
	CHECK(r1 - r0 >= 30 && r1 - r0 <= 31, "+30s moved realtime by %lld s", r1 - r0);
	deadlines(500, 500);

	m0 = ns(CLOCK_MONOTONIC);
	r1 = real_s("before step -32s");
	CHECK(put("step -32000000000\n") == 0, "step -32s");
	r0 = real_s("after step -32s");
	CHECK(r0 - r1 <= -31 && r0 - r1 >= -33, "-32s moved realtime by %lld s", r0 - r1);
	CHECK(ns(CLOCK_MONOTONIC) >= m0, "monotonic went back");

	CHECK(put("rate 1000000000\n") == -ERANGE, "a rate of 100%% was taken");
	CHECK(put("jump 5\n") == -EINVAL, "an unknown word was taken");
	CHECK(put("rate 100000000\n") == 0, "rate +10%%");
	r0 = ns(CLOCK_REALTIME);
	m0 = ns(CLOCK_MONOTONIC);
	nanosleep(&second, NULL);
	r1 = ns(CLOCK_REALTIME);
	m1 = ns(CLOCK_MONOTONIC);
	printf("rate +10%%: realtime %lld us in %lld us\n", (r1 - r0) / 1000, (m1 - m0) / 1000);
	CHECK(llabs((r1 - r0) - (m1 - m0) * 11 / 10) < 2000000, "the rate is off");
	deadlines(1100, 1000);
	CHECK(put("rate 0\n") == 0, "rate 0");
	return failures ? 1 : 0;
}
