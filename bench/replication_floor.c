/* The least any program can do for a replicated PUB on this machine: replication_floor.py in C.
 *
 * The same two programs, the same hops and the same bytes as bench/replication_floor.py, with no
 * interpreter in them: ``relay`` speaks just enough of NSQ's protocol V2 for Go's bench tools (the
 * magic, PUB, MPUB, the OK frame) and, with a peer, sends each poll's bodies to it as one batch
 * and answers OK only when the peer's 8-byte acknowledgement comes back; ``peer`` appends each
 * batch to a file with one write and acknowledges it.  What is left of a replicated publish is the
 * machine's: system calls, loopback TCP and waking three processes on its CPUs.
 *
 *   cc -O2 -o floor bench/replication_floor.c
 *   floor relay PORT [PEER_PORT]      (FLOOR_SPIN_US=50: poll 50 us before sleeping, as nsqd does)
 *   floor peer PORT FILE
 *
 * bench/bench_replication.py builds and runs it when a C compiler is there.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAXFD 1024
#define BUF (8 << 20)

static const char OK[10] = {0, 0, 0, 6, 0, 0, 0, 0, 'O', 'K'};

static void die(const char *what) { perror(what); exit(1); }

static int listen_on(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 64)) die("listen");
    return s;
}

static void nodelay(int fd) { int one = 1; setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); }

static void send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, 0);
        if (k < 0) { if (errno == EAGAIN || errno == EINTR) continue; die("send"); }
        p += k; n -= (size_t)k;
    }
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

struct client { unsigned char *buf; size_t len; };
static struct client clients[MAXFD];

/* per batch sent to the peer: the OKs it releases, as (fd, count) pairs */
#define MAXB 4096
static int wait_fd[MAXB][64], wait_n[MAXB][64], wait_k[MAXB];
static unsigned head, tail;

static int relay(int port, int peer_port) {
    int ep = epoll_create1(0), ls = listen_on(port), link = -1;
    struct epoll_event ev = {.events = EPOLLIN}, evs[64];
    double spin = getenv("FLOOR_SPIN_US") ? atof(getenv("FLOOR_SPIN_US")) / 1e6 : 0;
    ev.data.fd = ls; epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    if (peer_port) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(peer_port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        link = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(link, (struct sockaddr *)&a, sizeof a)) die("connect");
        nodelay(link);
        ev.data.fd = link; epoll_ctl(ep, EPOLL_CTL_ADD, link, &ev);
    }
    unsigned char *batch = malloc(BUF), ack[4096];
    size_t acklen = 0;
    uint64_t seq = 0;
    for (;;) {
        int n = 0;
        if (spin > 0) {
            double end = now() + spin;
            do n = epoll_wait(ep, evs, 64, 0); while (n == 0 && now() < end);
        }
        if (n == 0) n = epoll_wait(ep, evs, 64, -1);
        if (n < 0) { if (errno == EINTR) continue; die("epoll_wait"); }
        size_t blen = 16;  /* seq (8) and payload length (4) first, filled in below */
        int k = 0;
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                int c = accept(ls, NULL, NULL);
                if (c < 0 || c >= MAXFD) { if (c >= 0) close(c); continue; }
                nodelay(c);
                clients[c].buf = malloc(BUF); clients[c].len = 0;
                ev.data.fd = c; epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
            } else if (fd == link) {
                ssize_t r = recv(link, ack + acklen, sizeof ack - acklen, 0);
                if (r <= 0) return 0;
                acklen += (size_t)r;
                while (acklen >= 8) {
                    unsigned b = head++ % MAXB;
                    for (int j = 0; j < wait_k[b]; j++)
                        for (int m = 0; m < wait_n[b][j]; m++) send_all(wait_fd[b][j], OK, sizeof OK);
                    memmove(ack, ack + 8, acklen -= 8);
                }
            } else {
                struct client *c = &clients[fd];
                ssize_t r = recv(fd, c->buf + c->len, BUF - c->len, 0);
                if (r <= 0) { epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL); close(fd); free(c->buf); c->buf = NULL; continue; }
                c->len += (size_t)r;
                size_t pos = (c->len >= 4 && !memcmp(c->buf, "  V2", 4)) ? 4 : 0;
                int bodies = 0;
                for (;;) {  /* complete PUB/MPUB commands: a line, a 4-byte size, the body */
                    unsigned char *nl = memchr(c->buf + pos, '\n', c->len - pos);
                    if (!nl || (size_t)(nl - c->buf) + 5 > c->len) break;
                    size_t at = (size_t)(nl - c->buf) + 5, size = be32(nl + 1);
                    if (at + size > c->len) break;
                    if (link >= 0) {  /* the body, length-prefixed, into this poll's batch */
                        unsigned char *p = batch + blen;
                        p[0] = size >> 24; p[1] = size >> 16; p[2] = size >> 8; p[3] = size;
                        memcpy(p + 4, c->buf + at, size);
                        blen += 4 + size;
                    }
                    bodies++;
                    pos = at + size;
                }
                memmove(c->buf, c->buf + pos, c->len -= pos);
                if (!bodies) continue;
                if (link < 0) { for (int m = 0; m < bodies; m++) send_all(fd, OK, sizeof OK); continue; }
                unsigned b = tail % MAXB;
                wait_fd[b][k] = fd; wait_n[b][k] = bodies; k++;
            }
        }
        if (k) {
            unsigned b = tail++ % MAXB;
            wait_k[b] = k;
            seq++;
            for (int i = 0; i < 8; i++) batch[4 + i] = seq >> (56 - 8 * i);
            uint32_t plen = (uint32_t)(blen - 16);
            batch[12] = plen >> 24; batch[13] = plen >> 16; batch[14] = plen >> 8; batch[15] = plen;
            send_all(link, (char *)batch + 4, blen - 4);
        }
    }
}

static int peer(int port, const char *path) {
    int ls = listen_on(port), fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) die("open");
    unsigned char *buf = malloc(BUF), acks[8 * 512];
    for (;;) {  /* one link at a time (a readiness probe connects and closes first) */
        int c = accept(ls, NULL, NULL);
        if (c < 0) continue;
        nodelay(c);
        size_t len = 0;
        for (;;) {
            ssize_t r = recv(c, buf + len, BUF - len, 0);
            if (r <= 0) break;
            len += (size_t)r;
            size_t pos = 0, na = 0;
            while (len - pos >= 12 && na < 512) {
                size_t size = be32(buf + pos + 8);
                if (len - pos < 12 + size) break;
                if (write(fd, buf + pos, 12 + size) < 0) die("write");
                memcpy(acks + 8 * na++, buf + pos, 8);
                pos += 12 + size;
            }
            memmove(buf, buf + pos, len -= pos);
            if (na) send_all(c, (char *)acks, 8 * na);
        }
        close(c);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "relay")) return relay(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 0);
    if (argc == 4 && !strcmp(argv[1], "peer")) return peer(atoi(argv[2]), argv[3]);
    fprintf(stderr, "usage: %s relay PORT [PEER_PORT] | peer PORT FILE\n", argv[0]);
    return 2;
}
