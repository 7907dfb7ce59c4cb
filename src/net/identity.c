/* Node identity file and cluster key derivation (see identity.h).
 *
 * The key file is read with O_NOFOLLOW and must be a regular file of
 * exactly EXO_IDENTITY_FILE_LEN bytes; the public half stored inside the
 * secret key must be the one its seed generates, so a file damaged in its
 * second half is caught here rather than as signatures nobody can verify.
 * Every buffer that held secret bytes is wiped before it goes out of scope. */
#include "net/identity.h"

#include "core/alloc.h"
#include "core/bytes.h"
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void sodium_ready(void)
{
    /* sodium_init is idempotent and thread-safe; it fails only when the
     * system has no usable randomness, where no key can be made safely. */
    if (sodium_init() < 0) {
        fprintf(stderr, "exo: libsodium could not initialise (no system randomness)\n");
        abort();
    }
}

void exo_identity_node_id_of(const uint8_t pk[32], char out[EXO_NODE_ID_LEN + 1])
{
    static const char label[] = "exo node id v1";
    uint8_t h[32];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof h);
    crypto_generichash_update(&st, (const uint8_t *)label, sizeof label - 1);
    crypto_generichash_update(&st, pk, 32);
    crypto_generichash_final(&st, h, sizeof h);
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[h[i] >> 4];
        out[2 * i + 1] = hex[h[i] & 15];
    }
    out[EXO_NODE_ID_LEN] = 0;
}

bool exo_identity_id_valid(const char *s)
{
    if (!s)
        return false;
    for (int i = 0; i < EXO_NODE_ID_LEN; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return s[EXO_NODE_ID_LEN] == 0;
}

void exo_identity_wipe(exo_identity *id)
{
    sodium_memzero(id->sk, sizeof id->sk);
}

#define REMOVE_HINT "; if this node's identity may be discarded, remove the file to mint a new one " \
                    "(the node id will change)"

/* 0 loaded, 1 file absent, < 0 error. */
static int load_file(const char *path, exo_identity *out, exo_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT)
            return 1;
        if (errno == ELOOP)
            return exo_err_set(err, EXO_EFORMAT, "%s: is a symbolic link, not a key file" REMOVE_HINT, path);
        return exo_err_set(err, EXO_EIO, "%s: open: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        int e = errno;
        close(fd);
        return exo_err_set(err, EXO_EIO, "%s: stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return exo_err_set(err, EXO_EFORMAT, "%s: not a regular file" REMOVE_HINT, path);
    }
    /* One byte more than a valid file, to tell "too long" from "exact". */
    uint8_t buf[EXO_IDENTITY_FILE_LEN + 1];
    ssize_t n_read = exo_read_full(fd, buf, sizeof buf);
    size_t got = n_read < 0 ? 0 : (size_t)n_read;
    if (n_read < 0) {
        int e = errno;
        close(fd);
        sodium_memzero(buf, sizeof buf);
        return exo_err_set(err, EXO_EIO, "%s: read: %s", path, strerror(e));
    }
    close(fd);
    int rc = 0;
    if (got != EXO_IDENTITY_FILE_LEN) {
        if (got > EXO_IDENTITY_FILE_LEN)
            rc = exo_err_set(err, EXO_EFORMAT, "%s: longer than the %d bytes of a node key file" REMOVE_HINT,
                             path, EXO_IDENTITY_FILE_LEN);
        else
            rc = exo_err_set(err, EXO_EFORMAT, "%s: %zu bytes, a node key file has exactly %d" REMOVE_HINT,
                             path, got, EXO_IDENTITY_FILE_LEN);
    } else if (memcmp(buf, EXO_IDENTITY_MAGIC, 8) != 0) {
        rc = exo_err_set(err, EXO_EFORMAT, "%s: not a node key file (bad magic)" REMOVE_HINT, path);
    } else {
        uint8_t pk[32], sk[64];
        crypto_sign_seed_keypair(pk, sk, buf + 8); /* the seed is the first half of sk */
        if (sodium_memcmp(sk, buf + 8, 64) != 0) {
            rc = exo_err_set(err, EXO_EFORMAT, "%s: corrupt node key (its public key does not match its seed)"
                             REMOVE_HINT, path);
        } else {
            memcpy(out->pk, pk, 32);
            memcpy(out->sk, sk, 64);
            exo_identity_node_id_of(out->pk, out->node_id);
        }
        sodium_memzero(sk, sizeof sk);
    }
    sodium_memzero(buf, sizeof buf);
    if (rc == 0 && (sb.st_mode & 077))
        EXO_LOG_WARN("%s is readable by group or others (mode %03o): anyone who can read it can impersonate "
                     "this node; run chmod 600 on it", path, (unsigned)(sb.st_mode & 0777));
    return rc;
}

static void sync_dir(const char *dir)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

/* Writes a fresh key to path; 0 written, 1 someone else created the file
 * first (load theirs), < 0 error. */
static int create_file(const char *data_dir, const char *path, exo_identity *out, exo_err *err)
{
    size_t tlen = strlen(data_dir) + 64;
    char *tmp = exo_malloc(tlen);
    uint32_t nonce = randombytes_random();
    snprintf(tmp, tlen, "%s/.node_key.tmp.%ld.%08x", data_dir, (long)getpid(), nonce);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        int e = errno;
        int rc = exo_err_set(err, e == ENOENT ? EXO_ENOENT : EXO_EIO, "%s: create: %s%s", tmp, strerror(e),
                             e == ENOENT ? " (the data directory must exist)" : "");
        exo_free(tmp);
        return rc;
    }
    uint8_t buf[EXO_IDENTITY_FILE_LEN];
    crypto_sign_keypair(out->pk, out->sk);
    memcpy(buf, EXO_IDENTITY_MAGIC, 8);
    memcpy(buf + 8, out->sk, 64);
    int rc = 0;
    /* fchmod: the umask may have been looser than 0600 allows at open. */
    if (fchmod(fd, 0600) < 0 || exo_write_full(fd, buf, sizeof buf) < 0 || fsync(fd) < 0)
        rc = exo_err_set(err, EXO_EIO, "%s: write: %s", tmp, strerror(errno));
    sodium_memzero(buf, sizeof buf);
    if (close(fd) < 0 && rc == 0)
        rc = exo_err_set(err, EXO_EIO, "%s: close: %s", tmp, strerror(errno));
    if (rc == 0) {
        /* link() fails if the name exists: two processes racing here end up
         * with the same identity instead of the later rename winning. File
         * systems without hard links fall back to rename. */
        if (link(tmp, path) < 0) {
            int e = errno;
            if (e == EEXIST) {
                rc = 1;
            } else if (e == EPERM || e == ENOTSUP || e == EOPNOTSUPP || e == ENOSYS || e == EMLINK) {
                if (rename(tmp, path) < 0)
                    rc = exo_err_set(err, EXO_EIO, "%s: rename to %s: %s", tmp, path, strerror(errno));
            } else {
                rc = exo_err_set(err, EXO_EIO, "%s: link to %s: %s", tmp, path, strerror(e));
            }
        }
    }
    unlink(tmp); /* after rename there is nothing to unlink: harmless */
    exo_free(tmp);
    if (rc == 0) {
        sync_dir(data_dir);
        exo_identity_node_id_of(out->pk, out->node_id);
        EXO_LOG_INFO("minted a new node identity %s in %s", out->node_id, path);
    } else {
        exo_identity_wipe(out);
    }
    return rc;
}

int exo_identity_load_or_create(const char *data_dir, exo_identity *out, exo_err *err)
{
    sodium_ready();
    memset(out, 0, sizeof *out);
    struct stat sb;
    if (stat(data_dir, &sb) < 0 || !S_ISDIR(sb.st_mode))
        return exo_err_set(err, EXO_ENOENT, "%s: data directory does not exist", data_dir);
    size_t plen = strlen(data_dir) + sizeof "/" EXO_IDENTITY_FILE;
    char *path = exo_malloc(plen);
    snprintf(path, plen, "%s/" EXO_IDENTITY_FILE, data_dir);
    int rc = load_file(path, out, err);
    if (rc == 1) {
        rc = create_file(data_dir, path, out, err);
        if (rc == 1) /* lost a creation race: the winner's key is the identity */
            rc = load_file(path, out, err);
        if (rc == 1)
            rc = exo_err_set(err, EXO_EIO, "%s: vanished while being created", path);
    }
    exo_free(path);
    if (rc < 0)
        exo_identity_wipe(out);
    return rc;
}

/* ---- cluster keys ---- */

static void hash_labelled(uint8_t out[32], const uint8_t *key, size_t key_len, const char *label, bool sep,
                          const char *data, size_t data_len)
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, key, key_len, 32);
    crypto_generichash_update(&st, (const uint8_t *)label, strlen(label));
    if (sep) {
        static const uint8_t zero = 0;
        crypto_generichash_update(&st, &zero, 1);
    }
    if (data_len)
        crypto_generichash_update(&st, (const uint8_t *)data, data_len);
    crypto_generichash_final(&st, out, 32);
}

void exo_net_keys_derive(const char *ns, const char *secret, exo_net_keys *out)
{
    sodium_ready();
    if (!ns)
        ns = "";
    size_t ns_len = strlen(ns);
    uint8_t secret_key[32], h[32];
    if (!secret || !secret[0]) {
        hash_labelled(secret_key, NULL, 0, "exo secret v1", false, NULL, 0);
    } else {
        /* Argon2id password "exo secret v1" || secret, salted per namespace
         * so one precomputed table does not serve every cluster. */
        static const char label[] = "exo secret v1";
        size_t slen = strlen(secret), pwlen = sizeof label - 1 + slen;
        char *pw = exo_malloc(pwlen);
        memcpy(pw, label, sizeof label - 1);
        memcpy(pw + sizeof label - 1, secret, slen);
        uint8_t salt_full[32];
        hash_labelled(salt_full, NULL, 0, "exo secret salt v1", true, ns, ns_len);
        uint8_t salt[crypto_pwhash_SALTBYTES];
        memcpy(salt, salt_full, sizeof salt);
        int rc = crypto_pwhash(secret_key, sizeof secret_key, pw, pwlen, salt,
                               crypto_pwhash_OPSLIMIT_INTERACTIVE, crypto_pwhash_MEMLIMIT_INTERACTIVE,
                               crypto_pwhash_ALG_ARGON2ID13);
        sodium_memzero(pw, pwlen);
        exo_free(pw);
        if (rc != 0) {
            /* Only an allocation failure gets here (the parameters are
             * constants within libsodium's limits): exo_malloc's policy. */
            fprintf(stderr, "exo: out of memory deriving the cluster key (Argon2id needs %zu bytes)\n",
                    (size_t)crypto_pwhash_MEMLIMIT_INTERACTIVE);
            abort();
        }
    }
    hash_labelled(out->psk, secret_key, sizeof secret_key, "exo psk v1", true, ns, ns_len);
    hash_labelled(h, NULL, 0, "exo namespace v1", true, ns, ns_len);
    memcpy(out->ns_hash, h, sizeof out->ns_hash);
    hash_labelled(out->announce_key, out->psk, sizeof out->psk, "exo announce v1", false, NULL, 0);
    sodium_memzero(secret_key, sizeof secret_key);
}

void exo_net_keys_wipe(exo_net_keys *keys)
{
    sodium_memzero(keys, sizeof *keys);
}
