/* Node identity file and cluster key derivation: creation, reload, refusal
 * of damaged files (which must stay untouched), file mode, and fixed key
 * vectors (BLAKE2b parts checked against Python's hashlib, the Argon2id
 * part recomputed here from the formula in identity.h). */
#include "core/alloc.h"
#include "net/identity.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *tmp_dir(void)
{
    char tmpl[] = "/tmp/exo_test_ident_XXXXXX";
    char *d = mkdtemp(tmpl);
    cr_assert_not_null(d);
    return exo_strdup(d);
}

static char *key_path(const char *dir)
{
    size_t n = strlen(dir) + 16;
    char *p = exo_malloc(n);
    snprintf(p, n, "%s/node_key", dir);
    return p;
}

static size_t read_file(const char *path, uint8_t *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static void write_file(const char *path, const uint8_t *buf, size_t n, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, buf, n), (ssize_t)n);
    fchmod(fd, mode);
    close(fd);
}

static void rm_dir(char *dir)
{
    char *p = key_path(dir);
    unlink(p);
    exo_free(p);
    rmdir(dir);
    exo_free(dir);
}

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

Test(net_identity, create_then_reload_same_id)
{
    char *dir = tmp_dir();
    exo_err err = {0};
    exo_identity a, b;
    cr_assert_eq(exo_identity_load_or_create(dir, &a, &err), 0, "%s", err.msg);
    cr_assert(exo_identity_id_valid(a.node_id));
    char expect[33];
    exo_identity_node_id_of(a.pk, expect);
    cr_assert_str_eq(a.node_id, expect);
    cr_assert_eq(exo_identity_load_or_create(dir, &b, &err), 0, "%s", err.msg);
    cr_assert_str_eq(a.node_id, b.node_id);
    cr_assert_eq(memcmp(a.sk, b.sk, 64), 0);
    cr_assert_eq(memcmp(a.pk, a.sk + 32, 32), 0);

    /* The key signs and its public half verifies. */
    uint8_t sig[64];
    crypto_sign_detached(sig, NULL, (const uint8_t *)"m", 1, b.sk);
    cr_assert_eq(crypto_sign_verify_detached(sig, (const uint8_t *)"m", 1, a.pk), 0);

    char *p = key_path(dir);
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0600, "mode %o", sb.st_mode & 0777);
    cr_assert_eq(sb.st_size, EXO_IDENTITY_FILE_LEN);
    uint8_t buf[128];
    cr_assert_eq(read_file(p, buf, sizeof buf), EXO_IDENTITY_FILE_LEN);
    cr_assert_eq(memcmp(buf, "EXOKEY1\n", 8), 0);
    cr_assert_eq(memcmp(buf + 8, a.sk, 64), 0);
    exo_free(p);

    /* Two directories, two identities. */
    char *dir2 = tmp_dir();
    exo_identity c;
    cr_assert_eq(exo_identity_load_or_create(dir2, &c, &err), 0, "%s", err.msg);
    cr_assert_str_neq(a.node_id, c.node_id);
    rm_dir(dir2);
    rm_dir(dir);
}

Test(net_identity, creation_ignores_a_loose_umask)
{
    mode_t old = umask(0);
    char *dir = tmp_dir();
    exo_err err = {0};
    exo_identity a;
    cr_assert_eq(exo_identity_load_or_create(dir, &a, &err), 0, "%s", err.msg);
    umask(old);
    char *p = key_path(dir);
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0600);
    /* No temporary file left behind. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 1", dir);
    cr_assert_eq(system(cmd), 0, "stray files in %s", dir);
    exo_free(p);
    rm_dir(dir);
}

static void expect_rejected(const char *dir, const uint8_t *content, size_t n, const char *what)
{
    char *p = key_path(dir);
    write_file(p, content, n, 0600);
    exo_err err = {0};
    exo_identity id;
    memset(&id, 0xAA, sizeof id);
    cr_assert_eq(exo_identity_load_or_create(dir, &id, &err), EXO_EFORMAT, "%s: %s", what, err.msg);
    cr_assert_not_null(strstr(err.msg, "remove the file"), "%s: %s", what, err.msg);
    /* the key buffer of a failed load holds nothing secret */
    static const uint8_t zero[64];
    cr_assert_eq(memcmp(id.sk, zero, 64), 0, "%s", what);
    /* untouched: never regenerated */
    uint8_t back[256];
    size_t got = read_file(p, back, sizeof back);
    cr_assert_eq(got, n, "%s: file size changed", what);
    cr_assert_eq(memcmp(back, content, n), 0, "%s: file content changed", what);
    exo_free(p);
}

Test(net_identity, malformed_files_are_refused_and_left_alone)
{
    char *dir = tmp_dir();
    exo_err err = {0};
    exo_identity a;
    cr_assert_eq(exo_identity_load_or_create(dir, &a, &err), 0, "%s", err.msg);
    uint8_t good[EXO_IDENTITY_FILE_LEN + 8];
    char *p = key_path(dir);
    cr_assert_eq(read_file(p, good, sizeof good), EXO_IDENTITY_FILE_LEN);

    uint8_t bad[EXO_IDENTITY_FILE_LEN + 8];
    expect_rejected(dir, good, 0, "empty");
    expect_rejected(dir, good, EXO_IDENTITY_FILE_LEN - 1, "truncated");
    memcpy(bad, good, EXO_IDENTITY_FILE_LEN);
    bad[EXO_IDENTITY_FILE_LEN] = '\n';
    expect_rejected(dir, bad, EXO_IDENTITY_FILE_LEN + 1, "one byte too long");
    memcpy(bad, good, EXO_IDENTITY_FILE_LEN);
    bad[6] = '2';
    expect_rejected(dir, bad, EXO_IDENTITY_FILE_LEN, "magic");
    memcpy(bad, good, EXO_IDENTITY_FILE_LEN);
    bad[8 + 40] ^= 1; /* public half */
    expect_rejected(dir, bad, EXO_IDENTITY_FILE_LEN, "public key");
    memcpy(bad, good, EXO_IDENTITY_FILE_LEN);
    bad[8 + 3] ^= 0x80; /* seed */
    expect_rejected(dir, bad, EXO_IDENTITY_FILE_LEN, "seed");

    /* Restored, the original identity loads again. */
    write_file(p, good, EXO_IDENTITY_FILE_LEN, 0600);
    exo_identity b;
    cr_assert_eq(exo_identity_load_or_create(dir, &b, &err), 0, "%s", err.msg);
    cr_assert_str_eq(a.node_id, b.node_id);

    /* A symlink is not followed. */
    unlink(p);
    cr_assert_eq(symlink("/etc/hostname", p), 0);
    cr_assert_eq(exo_identity_load_or_create(dir, &b, &err), EXO_EFORMAT);
    exo_free(p);
    rm_dir(dir);
}

Test(net_identity, group_readable_file_still_loads)
{
    char *dir = tmp_dir();
    exo_err err = {0};
    exo_identity a, b;
    cr_assert_eq(exo_identity_load_or_create(dir, &a, &err), 0, "%s", err.msg);
    char *p = key_path(dir);
    cr_assert_eq(chmod(p, 0644), 0);
    cr_assert_eq(exo_identity_load_or_create(dir, &b, &err), 0, "%s", err.msg);
    cr_assert_str_eq(a.node_id, b.node_id);
    exo_free(p);
    rm_dir(dir);
}

Test(net_identity, missing_data_dir)
{
    exo_err err = {0};
    exo_identity a;
    cr_assert_eq(exo_identity_load_or_create("/nonexistent/exo/dir", &a, &err), EXO_ENOENT);
    cr_assert_not_null(strstr(err.msg, "/nonexistent/exo/dir"));
}

Test(net_identity, node_id_vector_and_validation)
{
    uint8_t pk[32];
    for (int i = 0; i < 32; i++)
        pk[i] = (uint8_t)i;
    char id[33];
    exo_identity_node_id_of(pk, id);
    /* hashlib.blake2b(b"exo node id v1" + bytes(range(32)), digest_size=32).digest()[:16].hex() */
    cr_assert_str_eq(id, "972f0f60003745072a031bc2f08b5df5");
    cr_assert(exo_identity_id_valid(id));
    cr_assert_not(exo_identity_id_valid("972F0F60003745072A031BC2F08B5DF5"));
    cr_assert_not(exo_identity_id_valid("972f0f60003745072a031bc2f08b5df"));
    cr_assert_not(exo_identity_id_valid("972f0f60003745072a031bc2f08b5df5a"));
    cr_assert_not(exo_identity_id_valid("972f0f60003745072a031bc2f08b5dfg"));
    cr_assert_not(exo_identity_id_valid(NULL));
}

Test(net_identity, key_vectors_without_secret)
{
    /* Computed with Python hashlib (an independent BLAKE2b):
     *   sk = blake2b(b"exo secret v1", 32); psk = blake2b(b"exo psk v1\0" + ns, key=sk, 32) ... */
    static const struct {
        const char *ns, *psk, *ns_hash, *announce;
    } v[] = {
        {"", "94c339af1a8af6ccf0fe966ea8589f4a8a4681693b28025563ed2a42f59ba239", "a39dcfd4a4943e0a",
         "4b0749ab78b04ec617e9aaeb6cff0a1048e4b12ae1b6f3f7d35da8aa3bd26ecd"},
        {"exo-cluster", "fd23f562d93fb21baf72627d1e6cecc56a774e41027e13d8093642568a45c88f",
         "729bdda321ed0389", "dd42da0310c697b3b663b7018c85fb92503ee1627879f281900f91faf64bb708"},
        {"other", "aacdba7c81bbb2edd5c9f2ef5958ab440eb9e79d51795704243989b5d487d311", "5df8f8db47530827",
         "ba80026ded8726a74c1ce3cf09fe422f6fa2f937731c5874ead5a7407dfb8e30"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        exo_net_keys k, k2;
        exo_net_keys_derive(v[i].ns, NULL, &k);
        exo_net_keys_derive(v[i].ns, "", &k2); /* "" is no secret too */
        cr_assert_eq(memcmp(&k, &k2, sizeof k), 0);
        char h[65];
        hex(k.psk, 32, h);
        cr_assert_str_eq(h, v[i].psk, "ns '%s'", v[i].ns);
        hex(k.ns_hash, 8, h);
        cr_assert_str_eq(h, v[i].ns_hash, "ns '%s'", v[i].ns);
        hex(k.announce_key, 32, h);
        cr_assert_str_eq(h, v[i].announce, "ns '%s'", v[i].ns);
    }
    exo_net_keys a, b;
    exo_net_keys_derive(NULL, NULL, &a);
    exo_net_keys_derive("", NULL, &b);
    cr_assert_eq(memcmp(&a, &b, sizeof a), 0, "NULL namespace is the empty one");
}

/* The formula of identity.h, written out with libsodium directly. */
static void reference_keys(const char *ns, const char *secret, exo_net_keys *out)
{
    uint8_t salt_full[32], salt[crypto_pwhash_SALTBYTES], sk[32];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, (const uint8_t *)"exo secret salt v1\0", 19);
    crypto_generichash_update(&st, (const uint8_t *)ns, strlen(ns));
    crypto_generichash_final(&st, salt_full, 32);
    memcpy(salt, salt_full, sizeof salt);
    char pw[256];
    snprintf(pw, sizeof pw, "exo secret v1%s", secret);
    cr_assert_eq(crypto_pwhash(sk, 32, pw, strlen(pw), salt, crypto_pwhash_OPSLIMIT_INTERACTIVE,
                               crypto_pwhash_MEMLIMIT_INTERACTIVE, crypto_pwhash_ALG_ARGON2ID13), 0);
    crypto_generichash_init(&st, sk, 32, 32);
    crypto_generichash_update(&st, (const uint8_t *)"exo psk v1\0", 11);
    crypto_generichash_update(&st, (const uint8_t *)ns, strlen(ns));
    crypto_generichash_final(&st, out->psk, 32);
    uint8_t h[32];
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, (const uint8_t *)"exo namespace v1\0", 17);
    crypto_generichash_update(&st, (const uint8_t *)ns, strlen(ns));
    crypto_generichash_final(&st, h, 32);
    memcpy(out->ns_hash, h, 8);
    crypto_generichash(out->announce_key, 32, (const uint8_t *)"exo announce v1", 15, out->psk, 32);
}

Test(net_identity, key_vectors_with_secret)
{
    cr_assert_geq(sodium_init(), 0);
    exo_net_keys k, again, ref, none, other_ns, other_secret;
    exo_net_keys_derive("exo-cluster", "correct horse battery staple", &k);
    exo_net_keys_derive("exo-cluster", "correct horse battery staple", &again);
    cr_assert_eq(memcmp(&k, &again, sizeof k), 0, "deterministic");
    reference_keys("exo-cluster", "correct horse battery staple", &ref);
    cr_assert_eq(memcmp(&k, &ref, sizeof k), 0, "matches the documented formula");
    char h[65];
    hex(k.psk, 32, h);
    /* Regression vector of this implementation (recomputed above independently). */
    cr_assert_str_eq(h, "db11f0082b5a9efe1b0f5f145c170a7de89fb12b2a09a304914024be07dfd898");

    exo_net_keys_derive("exo-cluster", NULL, &none);
    exo_net_keys_derive("exo-cluster2", "correct horse battery staple", &other_ns);
    exo_net_keys_derive("exo-cluster", "correct horse battery stapler", &other_secret);
    cr_assert_neq(memcmp(k.psk, none.psk, 32), 0);
    cr_assert_neq(memcmp(k.psk, other_ns.psk, 32), 0);
    cr_assert_neq(memcmp(k.psk, other_secret.psk, 32), 0);
    cr_assert_neq(memcmp(k.announce_key, other_secret.announce_key, 32), 0);
    cr_assert_neq(memcmp(k.announce_key, k.psk, 32), 0);
    /* The namespace hash names the namespace, not the secret. */
    cr_assert_eq(memcmp(k.ns_hash, none.ns_hash, 8), 0);
    cr_assert_eq(memcmp(k.ns_hash, other_secret.ns_hash, 8), 0);
    cr_assert_neq(memcmp(k.ns_hash, other_ns.ns_hash, 8), 0);
    exo_net_keys_wipe(&k);
    static const exo_net_keys zero;
    cr_assert_eq(memcmp(&k, &zero, sizeof k), 0);
}
