/* libFuzzer target for the HTTP front door: arbitrary bytes from a client,
 * through libmicrohttpd's parser and ours (framing checks, the API key, the
 * request memory budget, draining refused bodies, body parsing), on a real
 * loopback connection to a server started once with small limits. Whatever
 * the bytes, the server must answer with an HTTP status line or close, never
 * crash, leak or overrun, and close the connection once the client has
 * shut its side; and it must stay usable: every 256 inputs a
 * well-formed request must get its 200, and the memory budget must be back
 * to zero once no request is open. */
// FUZZ_SOURCES: src/api/http.c src/core/*.c
// FUZZ_LIBS: -lmicrohttpd
#include "api/http.h"
#include "core/json_util.h"
#include "fuzz_check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static exo_http_server *srv;
static int port;

static void parse_handler(exo_http_request *req, void *ud)
{
    size_t len;
    const char *body = exo_http_body(req, &len);
    json_t *j = NULL;
    exo_err err = {0};
    int rc = exo_ju_parse_body(body, len, &j, &err);
    char out[64];
    snprintf(out, sizeof out, "%d %zu", rc, j ? json_object_size(j) : 0);
    json_decref(j);
    exo_http_respond(req, rc ? 400 : 200, "text/plain", out, strlen(out));
}

static void ok_handler(exo_http_request *req, void *ud) { exo_http_respond(req, 200, "text/plain", "ok", 2); }

static void start(void)
{
    exo_http_config cfg = {.bind_addr = "127.0.0.1", .max_body = 4096, .threads = 2, .header_timeout_s = 0.3,
                           .body_timeout_s = 0.3, .memory_budget = 64 << 10, .api_key = "k3y"};
    srv = exo_http_create(&cfg);
    exo_http_route(srv, "POST", "/p", parse_handler, NULL);
    exo_http_route(srv, "GET", "/ok/{rest:path}", ok_handler, NULL);
    exo_err err = {0};
    CHECK(exo_http_start(srv, &err) == 0);
    port = exo_http_port(srv);
}

/* libFuzzer's timer (SIGALRM, -timeout) interrupts blocking calls: an
 * interrupted connect goes on by itself (wait until writable, then ask how
 * it ended), the others are tried again. */
static int connect_to(int fd, const struct sockaddr_in *a)
{
    if (connect(fd, (const struct sockaddr *)a, sizeof *a) == 0)
        return 0;
    if (errno != EINTR)
        return -1;
    struct pollfd p = {fd, POLLOUT, 0};
    int soerr = 0;
    socklen_t len = sizeof soerr;
    while (poll(&p, 1, 5000) < 0 && errno == EINTR)
        ;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr != 0) {
        errno = soerr ? soerr : errno;
        return -1;
    }
    return 0;
}

/* Sends bytes, ends the upload, reads until the server closes (or 1 s). */
static size_t exchange(const void *data, size_t size, char *out, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    /* from one of 200 loopback addresses in turn: the client shuts its side
     * first, so the server's end of each exchange waits in TIME_WAIT for a
     * minute, and thousands of exchanges a second would run one address's
     * ports out within seconds */
    static unsigned n;
    struct sockaddr_in from = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000002u + n++ % 200)};
    CHECK(bind(fd, (struct sockaddr *)&from, sizeof from) == 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect_to(fd, &a) != 0) {
        fprintf(stderr, "connect from 127.0.0.%u: %s\n", 2 + (n - 1) % 200, strerror(errno));
        abort();
    }
    size_t off = 0;
    while (off < size) {
        ssize_t w = send(fd, (const char *)data + off, size - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break; /* the server may close first (a refusal) */
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    size_t got = 0;
    struct pollfd p = {fd, POLLIN, 0};
    for (;;) {
        int ready = poll(&p, 1, 1000);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready != 1 || got == cap)
            break;
        ssize_t r = recv(fd, out + got, cap - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    return got;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned runs;
    if (!srv)
        start();
    static char out[1 << 16];
    size_t got = exchange(data, size, out, sizeof out);
    CHECK(got == 0 || (got >= 12 && !memcmp(out, "HTTP/1.", 7)));
    if (++runs % 256 == 0) {
        static const char good[] = "GET /ok/x HTTP/1.1\r\nHost: h\r\nx-api-key: k3y\r\nConnection: close\r\n\r\n";
        got = exchange(good, sizeof good - 1, out, sizeof out);
        CHECK(got >= 12 && !memcmp(out, "HTTP/1.1 200", 12));
        exo_http_stats st;
        exo_http_get_stats(srv, &st);
        CHECK(st.connections > 0 || st.memory_used == 0);
    }
    return 0;
}
