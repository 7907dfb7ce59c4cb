/* A node's long-term identity and the cluster's shared keys.
 *
 * Identity: one Ed25519 key pair per node, kept in <data_dir>/node_key as
 * "EXOKEY1\n" followed by the 64-byte libsodium secret key (seed || pk).
 * The node id is the lowercase hex of the first 16 bytes of
 * BLAKE2b-256("exo node id v1" || pk): 32 characters, stable for as long as
 * the file lives. That stability is why a malformed file is an error
 * (EXO_EFORMAT, "remove it to mint a new identity") and is never silently
 * replaced: a node that changed id would look like a new machine to the
 * cluster. The file is created atomically (temporary file 0600, fsync,
 * link() into place so two processes racing on one data dir agree on the
 * winner, fsync of the directory). A file readable by group or others still
 * loads, with a warning.
 *
 * Cluster keys: every node of a cluster derives the same keys from the
 * namespace and an optional shared secret (exo_net_keys_derive):
 *   secret_key   = no secret:  BLAKE2b-256("exo secret v1")
 *                  a secret:   Argon2id(password = "exo secret v1" || secret,
 *                                       salt = BLAKE2b-128("exo secret salt v1" || 0x00 || ns),
 *                                       ops/mem = libsodium's INTERACTIVE limits, 32 bytes)
 *   psk          = BLAKE2b-256(key = secret_key, "exo psk v1" || 0x00 || ns)
 *   ns_hash      = BLAKE2b-256("exo namespace v1" || 0x00 || ns)[0:8]
 *   announce_key = BLAKE2b-256(key = psk, "exo announce v1")
 * The secret goes through a memory-hard KDF because anything keyed by the
 * psk (one recorded handshake, one announcement packet) lets an eavesdropper
 * test guesses offline; with a plain hash a human-chosen secret falls to a
 * dictionary at billions of guesses per second, with Argon2id at ~64 MiB and
 * tens of milliseconds per guess. Without a secret the psk depends on the
 * namespace alone: the cluster is then isolated from other namespaces, not
 * protected from anyone who knows (or guesses) its namespace.
 *
 * Threading: none; all functions are reentrant.
 *
 * Example usage:
 *   exo_identity id;
 *   if (exo_identity_load_or_create(paths.data_dir, &id, &err) < 0) ...
 *   EXO_LOG_INFO("node id %s", id.node_id);
 *   exo_net_keys keys;
 *   exo_net_keys_derive(ns, getenv("EXO_CLUSTER_SECRET"), &keys);
 *   ... exo_net_new(loop, &(exo_net_config){.identity = &id, .psk = keys.psk}, ...);
 *   exo_identity_wipe(&id); exo_net_keys_wipe(&keys); */
#ifndef EXO_NET_IDENTITY_H
#define EXO_NET_IDENTITY_H

#include "core/error.h"

#include <stdbool.h>
#include <stdint.h>

#define EXO_NODE_ID_LEN      32   /* hex characters, without the NUL */
#define EXO_IDENTITY_FILE    "node_key"
#define EXO_IDENTITY_MAGIC   "EXOKEY1\n"
#define EXO_IDENTITY_FILE_LEN (8 + 64)

typedef struct exo_identity {
    uint8_t pk[32];                  /* Ed25519 public key */
    uint8_t sk[64];                  /* libsodium secret key: seed || pk */
    char    node_id[EXO_NODE_ID_LEN + 1];
} exo_identity;

/* Loads <data_dir>/node_key, or mints and stores a new identity if the file
 * does not exist. data_dir must exist. Errors: EXO_EFORMAT (the file exists
 * but is not a valid key; the message says to remove it), EXO_EIO (reading,
 * writing or syncing failed), EXO_ENOENT (data_dir missing). */
int exo_identity_load_or_create(const char *data_dir, exo_identity *out, exo_err *err);

/* out = the node id of an Ed25519 public key (32 lowercase hex chars + NUL). */
void exo_identity_node_id_of(const uint8_t pk[32], char out[EXO_NODE_ID_LEN + 1]);

/* True if s is a well-formed node id (exactly 32 lowercase hex characters). */
bool exo_identity_id_valid(const char *s);

/* Zeroes the secret key (sodium_memzero). */
void exo_identity_wipe(exo_identity *id);

typedef struct exo_net_keys {
    uint8_t psk[32];          /* keys every node-to-node channel */
    uint8_t ns_hash[8];       /* names the namespace in the clear (discovery) */
    uint8_t announce_key[32]; /* authenticates discovery announcements */
} exo_net_keys;

/* Derives the cluster keys (see above). ns NULL counts as ""; secret NULL
 * or "" means none. With a secret this takes tens of milliseconds and 64 MiB
 * (Argon2id); it aborts like exo_malloc if that memory cannot be had. */
void exo_net_keys_derive(const char *ns, const char *secret, exo_net_keys *out);

void exo_net_keys_wipe(exo_net_keys *keys);

#endif
