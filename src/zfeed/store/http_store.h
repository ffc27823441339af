// Stores over HTTP: a plain HTTP(S) server (read-only, by range requests: a static file server,
// a public cloud bucket's web address) and S3 or an S3-compatible object store (MinIO, Ceph,
// Google Cloud Storage's XML API), read, written and listed, signed with AWS Signature V4 where
// credentials are given. libcurl does the transfers and the signing.
//
// Remote reads are slow one at a time (each waits a round trip) and fast many at once, so such a
// store asks for `read_concurrency()` reads in flight: Array reads and the loader run its reads
// on the I/O pool (ThreadPool::io()) instead of one thread per core.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zfeed/store/store.h"

namespace zfeed {

struct HttpStoreOptions {
  // Every key K is read from base_url + "/" + K (percent-encoded) + query. No trailing slash.
  std::string base_url;
  // A plain HTTP store's query string ("?sv=...&sig=...": a signed or token URL), kept after
  // each key's path; "" for none.
  std::string query;
  // What url() says in messages: "s3://bucket/era5.zarr", "https://host/era5.zarr".
  std::string display_url;

  // S3 mode: listing (ListObjectsV2), writes (PUT) and deletes. Without it the store is
  // read-only and cannot list (plain HTTP has no listing: open groups with consolidated metadata).
  bool s3 = false;
  std::string bucket_url;  // endpoint + "/" + bucket: where ListObjectsV2 goes
  std::string key_prefix;  // the store's root inside the bucket: "" or "era5.zarr/"
  std::string region = "us-east-1";
  // Empty access_key: requests go unsigned (public buckets).
  std::string access_key, secret_key, session_token;

  long connect_timeout_ms = 10'000;
  // A transfer that moves no byte for this long fails (then is retried), so a stalled server
  // never hangs a read.
  long stall_timeout_s = 30;
  // Attempts after the first for errors that may pass: 5xx, 429, timeouts, dropped connections,
  // failed name lookups. The delay doubles at each retry, drawn between half and all of it (so
  // that many clients throttled at once do not retry at once), and is at least what the
  // server's Retry-After asks (up to 20 s).
  int retries = 5;
  long retry_delay_ms = 100;
  // Attempts after the first when the service throttles (429, 503, S3's SlowDown): throttling
  // lasts while the service adds capacity, so these wait longer, each delay up to 20 s.
  int throttle_retries = 10;
  // S3 answers 403 (AccessDenied), not 404, for a missing key when the credentials lack
  // s3:ListBucket; ZFEED_S3_FORBIDDEN_IS_MISSING=1 reads such keys as missing (a missing chunk
  // is then the fill value, as for a 404), where granting ListBucket is not possible.
  bool forbidden_is_missing = false;
  // Reads to keep in flight (ZFEED_IO_THREADS).
  size_t concurrency = 32;
};

// Options from a URL: "http://..." and "https://..." (plain HTTP); "s3://bucket/prefix" (endpoint
// from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else https://s3.REGION.amazonaws.com; region from
// AWS_REGION or AWS_DEFAULT_REGION; credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
// AWS_SESSION_TOKEN, none or AWS_NO_SIGN_REQUEST=1 for unsigned requests; where the environment
// does not say, the profile AWS_PROFILE (or "default") of ~/.aws/credentials and ~/.aws/config,
// or of AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE: region, endpoint_url and keys);
// "gs://bucket/prefix" (Google Cloud Storage's S3-compatible XML API at
// https://storage.googleapis.com, unsigned: public data). Paths use
// path-style addressing (endpoint/bucket/key).
HttpStoreOptions http_store_options(std::string_view url);

std::shared_ptr<Store> make_http_store(HttpStoreOptions options);

// For tests: the keys and sizes of one ListObjectsV2 response page (XML-unescaped), whether it is
// truncated, and the token for the next page.
struct ListPage {
  std::vector<std::string> keys;
  std::vector<uint64_t> sizes;               // of each key's value
  std::vector<std::string> common_prefixes;  // with a delimiter: the "folders", "a/b/"
  bool truncated = false;
  std::string next_token;
};
ListPage parse_list_objects(std::string_view xml);

// Percent-encodes everything but RFC 3986's unreserved characters, and "/" where keep_slash.
std::string percent_encode(std::string_view text, bool keep_slash);

}  // namespace zfeed
