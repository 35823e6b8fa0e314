/*
 * mdpbench: a load generator for Majordomo brokers (RFC 7 MDP/0.1, RFC 18 MDP/0.2, and
 * majortomo's variant), on libzmq alone.
 *
 * One thread polls every socket: N DEALER clients, each keeping --pipeline requests in
 * flight, and M DEALER echo workers that answer each request at once and send HEARTBEAT
 * whenever they have sent nothing for --heartbeat ms. So the generator costs little CPU
 * and what it measures is the broker. Each request's body is one frame that carries its
 * send time; the worker echoes it back, so latency needs no bookkeeping and replies may
 * come back in any order.
 *
 * Protocols (--client-proto, a comma list given to the clients in turn; --worker-proto):
 *   mdp1       RFC 7: [empty, MDPC01, service, body] / [empty, MDPW01, cmd, ...]
 *   mdp2       RFC 18: [MDPC02, 0x01, service, body] / [MDPW02, cmd, ...]
 *   majortomo  majortomo 0.2.0's variant of 0.2: an empty frame first as in 0.1, client
 *              REQUEST 0x02, broker->client PARTIAL/FINAL 0x03/0x04 and no service frame.
 *
 * Timing: workers send READY and settle for --settle seconds, then the clients start.
 * With --duration S (the default), replies in the first --warmup seconds are not counted,
 * then requests/s and latency come from the replies of the next S seconds; then no more
 * requests are sent and the ones in flight have --timeout seconds to come back (what does
 * not is "lost"). With --requests R, the clients send R requests in all, every reply is
 * counted, and the clock runs from the first send to the last reply.
 *
 * Output: one JSON object on stdout. Exit status 1 if a request was lost or answered wrong.
 *
 * Build: cc -O2 -o mdpbench mdpbench.c -lzmq -lm   (Debian: libzmq3-dev)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <zmq.h>

#define MAX_FRAMES 16

typedef enum { P_MDP1, P_MDP2, P_MAJORTOMO } proto_t;

typedef struct {
    void *sock;
    int is_worker;
    proto_t proto;
    long inflight;    /* clients: sent, not yet answered */
    long sent;        /* clients: requests sent */
    double last_send; /* workers: for heartbeats */
    int ready;        /* workers: READY sent */
} peer_t;

static const char *endpoint = "tcp://127.0.0.1:5555";
static const char *service = "echo";
static const char *client_protos = "mdp1";
static const char *worker_proto_name = "mdp1";
static int nclients = 4, nworkers = 4, pipeline_depth = 100, payload = 16;
static int io_threads = 1;
static long nrequests = 0;  /* 0: run for --duration */
static double duration = 5.0, warmup = 1.0, settle = 0.3, timeout_s = 10.0;
static double heartbeat_s = 2.5;

static void *ctx;
static peer_t *peers;
static int npeers;
static char *payload_buf;

/* the measurement */
static double t_start, t_window, t_end; /* window: [t_window, t_end) */
static int sending = 1;
static long total_sent = 0, total_done = 0, counted = 0;
static long errors = 0, disconnects = 0, worker_requests = 0;
static double *lat;
static long nlat = 0, lat_cap = 0;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what) {
    fprintf(stderr, "mdpbench: %s: %s\n", what, zmq_strerror(zmq_errno()));
    exit(2);
}

static int parse_proto(const char *name, size_t len, proto_t *out) {
    if (len == 4 && !strncmp(name, "mdp1", 4)) *out = P_MDP1;
    else if (len == 4 && !strncmp(name, "mdp2", 4)) *out = P_MDP2;
    else if (len == 9 && !strncmp(name, "majortomo", 9)) *out = P_MAJORTOMO;
    else return -1;
    return 0;
}

/* ---------------------------------------------------------------- frames */

typedef struct {
    const void *data;
    size_t size;
} frame_t;

static int send_frames(void *sock, const frame_t *frames, int n) {
    for (int i = 0; i < n; i++) {
        int flags = (i < n - 1 ? ZMQ_SNDMORE : 0);
        while (zmq_send(sock, frames[i].data, frames[i].size, flags) < 0) {
            if (zmq_errno() == EINTR) continue;
            if (zmq_errno() == EAGAIN) return -1; /* HWM: not expected here */
            die("zmq_send");
        }
    }
    return 0;
}

/* Receive one whole message without blocking: its frame count (frames past MAX_FRAMES are
 * dropped), 0 if none is waiting. */
static int recv_frames(void *sock, zmq_msg_t *msgs) {
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t scratch, *m = n < MAX_FRAMES ? &msgs[n] : &scratch;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(m);
            if (n == 0 && (zmq_errno() == EAGAIN || zmq_errno() == EINTR)) return 0;
            die("zmq_msg_recv");
        }
        more = zmq_msg_more(m);
        if (n < MAX_FRAMES) n++;
        else zmq_msg_close(m);
    }
    return n;
}

static void close_frames(zmq_msg_t *msgs, int n) {
    for (int i = 0; i < n; i++) zmq_msg_close(&msgs[i]);
}

static int frame_is(zmq_msg_t *m, const char *s, size_t len) {
    return zmq_msg_size(m) == len && memcmp(zmq_msg_data(m), s, len) == 0;
}

/* ---------------------------------------------------------------- clients */

static void client_send(peer_t *p) {
    double t = now();
    memcpy(payload_buf, &t, sizeof t);
    frame_t f[5];
    int n = 0;
    switch (p->proto) {
    case P_MDP1:
        f[n++] = (frame_t){"", 0};
        f[n++] = (frame_t){"MDPC01", 6};
        break;
    case P_MDP2:
        f[n++] = (frame_t){"MDPC02", 6};
        f[n++] = (frame_t){"\x01", 1};
        break;
    case P_MAJORTOMO:
        f[n++] = (frame_t){"", 0};
        f[n++] = (frame_t){"MDPC02", 6};
        f[n++] = (frame_t){"\x02", 1};
        break;
    }
    f[n++] = (frame_t){service, strlen(service)};
    f[n++] = (frame_t){payload_buf, (size_t)payload};
    if (send_frames(p->sock, f, n) < 0) die("client send would block");
    p->inflight++;
    p->sent++;
    total_sent++;
}

static int may_send(void) {
    if (!sending) return 0;
    if (nrequests > 0) return total_sent < nrequests;
    return 1;
}

static void record(double sent_at, double t) {
    if (nrequests == 0 && (t < t_window || t >= t_end)) return;
    if (nlat == lat_cap) {
        lat_cap = lat_cap ? lat_cap * 2 : 65536;
        lat = realloc(lat, lat_cap * sizeof *lat);
        if (!lat) die("realloc");
    }
    lat[nlat++] = t - sent_at;
    counted++;
}

/* A reply's body frame: the one we sent, echoed. */
static void client_reply(peer_t *p, zmq_msg_t *m, int n) {
    int body = -1, final = 0;
    switch (p->proto) {
    case P_MDP1: /* [empty, MDPC01, service, body...] */
        if (n >= 4 && frame_is(&m[1], "MDPC01", 6)) body = 3, final = 1;
        break;
    case P_MDP2: /* [MDPC02, 0x02 PARTIAL | 0x03 FINAL, service, body...] */
        if (n >= 3 && frame_is(&m[0], "MDPC02", 6)) {
            if (frame_is(&m[1], "\x02", 1)) return;
            if (frame_is(&m[1], "\x03", 1)) body = 3, final = 1;
        }
        break;
    case P_MAJORTOMO: /* [empty, MDPC02, 0x03 PARTIAL | 0x04 FINAL, body...] */
        if (n >= 3 && frame_is(&m[1], "MDPC02", 6)) {
            if (frame_is(&m[2], "\x03", 1)) return;
            if (frame_is(&m[2], "\x04", 1)) body = 3, final = 1;
        }
        break;
    }
    if (!final) {
        fprintf(stderr, "unexpected client message of %d frames\n", n);
        errors++;
        return;
    }
    p->inflight--;
    total_done++;
    double t = now();
    if (body < n && zmq_msg_size(&m[body]) == (size_t)payload) {
        double sent_at;
        memcpy(&sent_at, zmq_msg_data(&m[body]), sizeof sent_at);
        record(sent_at, t);
    } else {
        errors++; /* e.g. jobwire's error reply [\0jobwire:error, status, text] */
        if (errors < 5 && body < n)
            fprintf(stderr, "reply body of %zu bytes, %d frames\n", zmq_msg_size(&m[body]), n - body);
    }
    if (may_send()) client_send(p);
}

/* ---------------------------------------------------------------- workers */

typedef struct {
    int empty_first;
    const char *header;
    char ready, request, reply, heartbeat, disconnect;
} worker_dialect_t;

static const worker_dialect_t DIALECTS[] = {
    [P_MDP1] = {1, "MDPW01", 1, 2, 3, 4, 5},
    [P_MDP2] = {0, "MDPW02", 1, 2, 4, 5, 6},   /* reply: FINAL */
    [P_MAJORTOMO] = {1, "MDPW02", 1, 2, 4, 5, 6},
};

static void worker_command(peer_t *p, char cmd, const frame_t *extra, int nextra) {
    const worker_dialect_t *d = &DIALECTS[p->proto];
    frame_t f[MAX_FRAMES + 3];
    int n = 0;
    if (d->empty_first) f[n++] = (frame_t){"", 0};
    f[n++] = (frame_t){d->header, 6};
    f[n++] = (frame_t){&cmd, 1};
    for (int i = 0; i < nextra; i++) f[n++] = extra[i];
    if (send_frames(p->sock, f, n) < 0) die("worker send would block");
    p->last_send = now();
}

static void *new_socket(void) {
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    if (!s) die("zmq_socket");
    int zero = 0, hwm = 100000;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (zmq_connect(s, endpoint) < 0) die("zmq_connect");
    return s;
}

static void worker_ready(peer_t *p) {
    frame_t svc = {service, strlen(service)};
    worker_command(p, DIALECTS[p->proto].ready, &svc, 1);
    p->ready = 1;
}

static void worker_message(peer_t *p, zmq_msg_t *m, int n) {
    const worker_dialect_t *d = &DIALECTS[p->proto];
    int at = d->empty_first; /* index of the header */
    if (n < at + 2 || !frame_is(&m[at], d->header, 6) || zmq_msg_size(&m[at + 1]) != 1) {
        fprintf(stderr, "unexpected worker message of %d frames\n", n);
        errors++;
        return;
    }
    char cmd = *(char *)zmq_msg_data(&m[at + 1]);
    if (cmd == d->request && n >= at + 4) {
        /* [.., header, REQUEST, client, empty, body...] -> [.., header, REPLY, client, empty, body...] */
        frame_t f[MAX_FRAMES];
        int k = 0;
        for (int i = at + 2; i < n && k < MAX_FRAMES; i++)
            f[k++] = (frame_t){zmq_msg_data(&m[i]), zmq_msg_size(&m[i])};
        worker_command(p, d->reply, f, k);
        worker_requests++;
    } else if (cmd == d->heartbeat) {
        /* the broker is alive; nothing to do */
    } else if (cmd == d->disconnect) {
        /* RFC 7: close the socket and start again on a new one */
        disconnects++;
        zmq_close(p->sock);
        p->sock = new_socket();
        worker_ready(p);
    } else {
        fprintf(stderr, "unexpected worker command 0x%02x\n", (unsigned char)cmd);
        errors++;
    }
}

/* ---------------------------------------------------------------- main loop */

static void poll_once(zmq_pollitem_t *items, long timeout_ms) {
    for (int i = 0; i < npeers; i++) items[i].socket = peers[i].sock;
    int rc = zmq_poll(items, npeers, timeout_ms);
    if (rc < 0) {
        if (zmq_errno() == EINTR) return;
        die("zmq_poll");
    }
    zmq_msg_t m[MAX_FRAMES];
    for (int i = 0; i < npeers; i++) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        peer_t *p = &peers[i];
        int n;
        /* drain what is there (bounded, so one busy socket does not starve the others) */
        for (int k = 0; k < 256 && (n = recv_frames(p->sock, m)) > 0; k++) {
            if (p->is_worker) worker_message(p, m, n);
            else client_reply(p, m, n);
            close_frames(m, n);
        }
    }
    if (nworkers > 0) {
        double t = now();
        for (int i = 0; i < npeers; i++) {
            peer_t *p = &peers[i];
            if (p->is_worker && p->ready && t - p->last_send >= heartbeat_s)
                worker_command(p, DIALECTS[p->proto].heartbeat, NULL, 0);
        }
    }
}

static long inflight(void) {
    long n = 0;
    for (int i = 0; i < npeers; i++)
        if (!peers[i].is_worker) n += peers[i].inflight;
    return n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double p) {
    if (nlat == 0) return 0;
    long i = (long)(p * (nlat - 1) + 0.5);
    return lat[i] * 1e3;
}

static void usage(void) {
    fprintf(stderr,
        "usage: mdpbench [--endpoint tcp://H:P] [--service NAME] [--clients N] [--workers M]\n"
        "                [--pipeline W] [--client-proto mdp1|mdp2|majortomo[,..]]\n"
        "                [--worker-proto mdp1|mdp2|majortomo] [--duration S] [--warmup S]\n"
        "                [--requests R] [--payload BYTES] [--settle S] [--timeout S]\n"
        "                [--heartbeat S] [--io-threads N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    static struct option opts[] = {
        {"endpoint", 1, 0, 'e'}, {"service", 1, 0, 's'}, {"clients", 1, 0, 'c'},
        {"workers", 1, 0, 'w'}, {"pipeline", 1, 0, 'p'}, {"client-proto", 1, 0, 'C'},
        {"worker-proto", 1, 0, 'W'}, {"duration", 1, 0, 'd'}, {"warmup", 1, 0, 'u'},
        {"requests", 1, 0, 'r'}, {"payload", 1, 0, 'b'}, {"settle", 1, 0, 'S'},
        {"timeout", 1, 0, 't'}, {"heartbeat", 1, 0, 'h'}, {"io-threads", 1, 0, 'i'},
        {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'e': endpoint = optarg; break;
        case 's': service = optarg; break;
        case 'c': nclients = atoi(optarg); break;
        case 'w': nworkers = atoi(optarg); break;
        case 'p': pipeline_depth = atoi(optarg); break;
        case 'C': client_protos = optarg; break;
        case 'W': worker_proto_name = optarg; break;
        case 'd': duration = atof(optarg); break;
        case 'u': warmup = atof(optarg); break;
        case 'r': nrequests = atol(optarg); break;
        case 'b': payload = atoi(optarg); break;
        case 'S': settle = atof(optarg); break;
        case 't': timeout_s = atof(optarg); break;
        case 'h': heartbeat_s = atof(optarg); break;
        case 'i': io_threads = atoi(optarg); break;
        default: usage();
        }
    }
    if (optind != argc || nclients < 1 || nworkers < 0 || pipeline_depth < 1) usage();
    if (payload < (int)sizeof(double)) payload = sizeof(double);
    proto_t worker_proto;
    if (parse_proto(worker_proto_name, strlen(worker_proto_name), &worker_proto) < 0) usage();

    payload_buf = calloc(1, payload);
    ctx = zmq_ctx_new();
    zmq_ctx_set(ctx, ZMQ_IO_THREADS, io_threads);
    npeers = nclients + nworkers;
    peers = calloc(npeers, sizeof *peers);
    zmq_pollitem_t *items = calloc(npeers, sizeof *items);
    for (int i = 0; i < npeers; i++) items[i].events = ZMQ_POLLIN;

    /* workers first: READY, then let the broker register them */
    for (int i = 0; i < nworkers; i++) {
        peer_t *p = &peers[nclients + i];
        p->is_worker = 1;
        p->proto = worker_proto;
        p->sock = new_socket();
        worker_ready(p);
    }
    const char *cp = client_protos;
    for (int i = 0; i < nclients; i++) {
        const char *comma = strchr(cp, ',');
        size_t len = comma ? (size_t)(comma - cp) : strlen(cp);
        if (parse_proto(cp, len, &peers[i].proto) < 0) usage();
        cp = comma ? comma + 1 : client_protos;
        peers[i].sock = new_socket();
    }
    double settle_end = now() + settle;
    while (now() < settle_end) poll_once(items, 10);

    t_start = now();
    t_window = t_start + warmup;
    t_end = t_window + duration;
    if (nrequests > 0) t_window = t_start;
    for (int i = 0; i < nclients; i++)
        for (int k = 0; k < pipeline_depth && may_send(); k++) client_send(&peers[i]);

    double deadline = 0, t_last = t_start;
    for (;;) {
        double t = now();
        if (nrequests > 0) {
            if (total_done >= nrequests) { t_last = t; break; }
            if (t - t_start > timeout_s + 600) break;
        } else if (sending && t >= t_end) {
            sending = 0;
            deadline = t + timeout_s;
        }
        if (!sending && inflight() == 0) break;
        if (deadline && t >= deadline) break;
        if (nrequests > 0 && total_done < nrequests && t - t_last > timeout_s) break;
        long before = total_done;
        poll_once(items, 100);
        if (total_done != before) t_last = now();
    }
    double seconds = nrequests > 0 ? t_last - t_start : duration;
    long lost = inflight();

    qsort(lat, nlat, sizeof *lat, cmp_double);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
                 ru.ru_stime.tv_usec / 1e6;
    int complete = lost == 0 && errors == 0 && counted > 0;
    printf("{\"clients\":%d,\"workers\":%d,\"pipeline\":%d,\"client_proto\":\"%s\","
           "\"worker_proto\":\"%s\",\"payload\":%d,\"requests\":%ld,\"seconds\":%.4f,"
           "\"requests_per_s\":%.1f,\"p50_ms\":%.4f,\"p90_ms\":%.4f,\"p99_ms\":%.4f,"
           "\"max_ms\":%.4f,\"sent\":%ld,\"replies\":%ld,\"worker_requests\":%ld,"
           "\"lost\":%ld,\"errors\":%ld,\"disconnects\":%ld,\"cpu_s\":%.3f,\"complete\":%s}\n",
           nclients, nworkers, pipeline_depth, client_protos, worker_proto_name, payload,
           counted, seconds, counted / seconds, pct(0.50), pct(0.90), pct(0.99), pct(1.0),
           total_sent, total_done, worker_requests, lost, errors, disconnects, cpu,
           complete ? "true" : "false");
    /* leave politely, so the broker does not hand the next run's requests to us */
    for (int i = 0; i < npeers; i++)
        if (peers[i].is_worker) worker_command(&peers[i], DIALECTS[peers[i].proto].disconnect, NULL, 0);
    for (int i = 0; i < npeers; i++) {
        int linger = 100;
        zmq_setsockopt(peers[i].sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(peers[i].sock);
    }
    zmq_ctx_term(ctx);
    return complete ? 0 : 1;
}
