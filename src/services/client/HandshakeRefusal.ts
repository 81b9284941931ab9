/**
 * Why a client's handshake failed, in words for its `RequestTimeout`
 * (issue 14): the DEALER's monitor says the handshake failed and how, and
 * whether this client speaks CURVE tells which side lacks what. The
 * server's side of the same failure is counted and logged by Tenancy.
 */
import type { HandshakeFailure } from "../zmq/Sockets.ts"

/**
 * The sentence for `failure` (libzmq's handshake-failure events):
 * - `auth`: the server's ZAP handler refused this client's public key (its
 *   status, 400 for mpcache's allowlist);
 * - `mechanism`: one side speaks CURVE and the other does not
 *   (ERR_ZMTP_MECHANISM_MISMATCH);
 * - `protocol`: any other failure, e.g. EPIPE when the server hung up in the
 *   middle of the handshake because it could not decrypt the client's hello
 *   (a wrong server public key).
 */
export const handshakeRefusal = (failure: HandshakeFailure, clientSpeaksCurve: boolean): string => {
  switch (failure.reason) {
    case "auth":
      return `the server refused the CURVE handshake: its ZAP handler rejected this client's public key ` +
        `(ZAP status ${failure.status ?? 400}: the key is not in the server's --curve-authorized-keys file, or was removed from it)`
    case "mechanism":
      return clientSpeaksCurve
        ? "the CURVE handshake failed: the server does not speak CURVE (mechanism mismatch: it runs without --curve-secret-key-file)"
        : "the server refused the handshake: it requires CURVE and this client speaks none " +
          "(mechanism mismatch: give --curve-server-public-key-file and --curve-secret-key-file)"
    case "protocol":
      return clientSpeaksCurve
        ? `the CURVE handshake failed (${failure.code || "protocol error"}): is --curve-server-public-key-file this server's public key?`
        : `the handshake failed (${failure.code || "protocol error"})`
  }
}
