#include "zfeed/store/http_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "zfeed/store/http_testing.h"
#include "zfeed/util/error.h"
#include "zfeed/util/testing.h"
#include "zfeed/zarr/array.h"

namespace zfeed {
namespace {

using testing::error_of;
using testing::TestServer;
using testing::text;

HttpStoreOptions quick(const std::string& url) {
  HttpStoreOptions options = http_store_options(url);
  options.retry_delay_ms = 1;
  return options;
}

HttpStoreOptions s3_options(const TestServer& server, const std::string& prefix) {
  HttpStoreOptions options;
  options.s3 = true;
  options.bucket_url = server.url() + "/bucket";
  options.base_url = options.bucket_url + (prefix.empty() ? "" : "/" + prefix);
  options.key_prefix = prefix.empty() ? "" : prefix + "/";
  options.display_url = "s3://bucket/" + prefix;
  options.retry_delay_ms = 1;
  return options;
}

TEST(HttpStore, ReadsWholeValuesRangesAndSuffixes) {
  TestServer server;
  server.put("data/t/c/0", "0123456789");
  auto store = make_http_store(quick(server.url() + "/data/"));
  EXPECT_EQ(store->url(), server.url() + "/data");
  EXPECT_EQ(text(*store->get("t/c/0")), "0123456789");
  EXPECT_EQ(text(*store->get("t/c/0", ByteRange::range(2, 3))), "234");
  EXPECT_EQ(text(*store->get("t/c/0", ByteRange::suffix(4))), "6789");
  EXPECT_EQ(text(*store->get("t/c/0", ByteRange::range(10, 0))), "");
  EXPECT_EQ(store->size("t/c/0"), 10u);
  EXPECT_FALSE(store->get("t/c/1"));
  EXPECT_FALSE(store->size("t/c/1"));
  Bytes out;
  EXPECT_TRUE(store->get_into("t/c/0", ByteRange::range(8, 2), out));
  EXPECT_EQ(text(out), "89");
  uint8_t into[4];
  EXPECT_TRUE(store->read_range_into("t/c/0", 3, into, 10));
  EXPECT_EQ(std::string(reinterpret_cast<char*>(into), 4), "3456");
  EXPECT_THROW(store->read_range_into("t/c/0", 0, into, 12), SizeMismatchError);
}

TEST(HttpStore, RangesPastTheEndNameTheKey) {
  TestServer server;
  server.put("a/k", "0123456789");
  auto store = make_http_store(quick(server.url() + "/a"));
  for (ByteRange range : {ByteRange::range(12, 2), ByteRange::range(8, 5), ByteRange::suffix(11),
                          ByteRange::range(11, 0)}) {
    try {
      store->get("k", range);
      ADD_FAILURE() << range.describe();
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(server.url() + "/a/k"), std::string::npos)
          << error.what();
    }
  }
}

TEST(HttpStore, TakesItsRangeFromAServerThatSendsTheWholeValue) {
  TestServer server;
  server.put("k", "0123456789");
  server.ignore_range = true;
  auto store = make_http_store(quick(server.url()));
  EXPECT_EQ(text(*store->get("k", ByteRange::range(3, 4))), "3456");
  EXPECT_EQ(text(*store->get("k", ByteRange::suffix(2))), "89");
  EXPECT_THROW(store->get("k", ByteRange::range(9, 2)), Error);
}

TEST(HttpStore, RetriesErrorsThatMayPass) {
  TestServer server;
  server.put("k", "value");
  server.failures_left = 2;
  auto store = make_http_store(quick(server.url()));
  EXPECT_EQ(text(*store->get("k")), "value");
  EXPECT_EQ(server.requests.load(), 3);
}

TEST(HttpStore, ALastingErrorNamesTheKeyTheStatusAndTheAttempts) {
  TestServer server;
  server.put("k", "value");
  server.failures_left = 100;
  auto store = make_http_store(quick(server.url()));
  try {
    store->get("k");
    FAIL();
  } catch (const Error& error) {
    const std::string message = error.what();
    // Throttling is waited out longer than other errors (throttle_retries).
    EXPECT_NE(message.find(server.url() + "/k: HTTP 503 (SlowDown: Please reduce your request "
                                          "rate) after 11 attempts"),
              std::string::npos)
        << message;
  }
  EXPECT_EQ(server.requests.load(), 11);
  // A server error, five retries.
  server.requests = 0;
  server.failure_status = 500;
  {
    std::lock_guard lock(server.mutex());
    server.failure_code = "InternalError";
  }
  EXPECT_CONTAINS(error_of([&] { store->get("k"); }),
                  "/k: HTTP 500 (InternalError: Failing) after 6 attempts");
  EXPECT_EQ(server.requests.load(), 6);
  // An error that will not pass is not retried.
  server.requests = 0;
  server.failures_left = 100;
  server.failure_status = 403;
  EXPECT_THROW(store->get("k"), Error);
  EXPECT_EQ(server.requests.load(), 1);
}

TEST(HttpStore, RetriesS3sTimeoutsThatComeAs400) {
  TestServer server;
  server.put("bucket/k", "value");
  {
    std::lock_guard lock(server.mutex());
    server.failure_code = "RequestTimeout";  // "Your socket connection ... was not read from"
  }
  server.failure_status = 400;
  server.failures_left = 1;
  auto store = make_http_store(s3_options(server, ""));
  store->set("k", as_bytes("new value"));  // the upload is sent again, not lost
  EXPECT_EQ(server.requests.load(), 2);
  EXPECT_EQ(text(*store->get("k")), "new value");
}

TEST(HttpStore, ARedirectLoopIsAnErrorNotAStorm) {
  TestServer server;
  server.redirect_loop = true;
  auto store = make_http_store(quick(server.url()));
  EXPECT_CONTAINS(error_of([&] { store->get("k"); }), "/k: ");
  EXPECT_LE(server.requests.load(), 11);
}

TEST(HttpStore, A403SaysWhyAndCanReadAsMissing) {
  TestServer server;
  server.put("bucket/k", "value");
  auto options = s3_options(server, "");
  options.access_key = "AKIDEXAMPLE";
  options.secret_key = "secret";
  auto store = make_http_store(options);
  {
    std::lock_guard lock(server.mutex());
    server.failure_code = "AccessDenied";
  }
  server.failure_status = 403;
  // A HEAD has no error body: the store asks again by GET to name S3's code.
  server.failures_left = 2;
  const std::string error = error_of([&] { store->size("missing"); });
  EXPECT_CONTAINS(error, "/missing: HTTP 403 (AccessDenied: Failing)");
  EXPECT_CONTAINS(error, "lack s3:ListBucket");
  EXPECT_CONTAINS(error, "ZFEED_S3_FORBIDDEN_IS_MISSING=1");
  // A refused write or listing says which permission it needs, not the missing-key hint.
  server.failures_left = 1;
  const std::string write_error = error_of([&] { store->set("new", as_bytes("v")); });
  EXPECT_CONTAINS(write_error,
                  "/new: HTTP 403 (AccessDenied: Failing); the credentials may lack "
                  "s3:PutObject");
  EXPECT_FALSE(testing::contains(write_error, "missing key"));
  server.failures_left = 1;
  EXPECT_CONTAINS(error_of([&] { store->list(""); }), "may lack s3:ListBucket on this bucket");
  // Where asked, such keys read as missing.
  options.forbidden_is_missing = true;
  auto lenient = make_http_store(options);
  server.failures_left = 3;
  EXPECT_FALSE(lenient->get("missing"));
  EXPECT_FALSE(lenient->size("missing"));
  EXPECT_EQ(server.failures_left.load(), 0);
  // Unsigned requests say so instead.
  options.forbidden_is_missing = false;
  options.access_key.clear();
  server.failures_left = 1;
  EXPECT_CONTAINS(error_of([&] { make_http_store(options)->get("k"); }),
                  "the request was unsigned");
}

TEST(HttpStore, ASizeComesFromAOneByteReadWhereTheServerRefusesHead) {
  TestServer server;
  server.put("bucket/k", "value");
  auto store = make_http_store(s3_options(server, ""));
  server.failure_status = 405;  // Method Not Allowed
  server.failures_left = 1;     // the HEAD
  EXPECT_EQ(store->size("k"), std::optional<uint64_t>(5));
  server.failures_left = 1;
  EXPECT_EQ(store->size("absent"), std::nullopt);
}

TEST(HttpStore, AServerThatIsNotThereIsAnErrorNamingTheUrl) {
  int port;
  {
    TestServer gone;  // a port that was just free, now closed
    port = std::stoi(gone.url().substr(gone.url().rfind(':') + 1));
  }
  auto options = quick("http://127.0.0.1:" + std::to_string(port) + "/x");
  options.retries = 1;
  auto store = make_http_store(options);
  try {
    store->get("zarr.json");
    FAIL();
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("http://127.0.0.1:" + std::to_string(port) + "/x/zarr.json: "),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("after 2 attempts"), std::string::npos) << message;
  }
}

TEST(HttpStore, AStalledServerIsATimeoutNotAHang) {
  TestServer server;
  server.put("k", "value");
  server.stall = true;
  auto options = quick(server.url());
  options.stall_timeout_s = 1;
  options.retries = 0;
  auto store = make_http_store(options);
  const auto start = std::chrono::steady_clock::now();
  try {
    store->get("k");
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(server.url() + "/k: "), std::string::npos)
        << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(HttpStore, PlainHttpIsReadOnlyAndCannotList) {
  TestServer server;
  auto store = make_http_store(quick(server.url() + "/store"));
  try {
    store->set("k", as_bytes("v"));
    FAIL();
  } catch (const UnsupportedError& error) {
    EXPECT_NE(std::string(error.what()).find("/store/k: a plain HTTP store is read-only"),
              std::string::npos)
        << error.what();
  }
  EXPECT_THROW(store->erase("k"), UnsupportedError);
  EXPECT_THROW(store->list(""), UnsupportedError);
  EXPECT_FALSE(store->can_list());
  EXPECT_THROW(store->get("../secret"), Error);
}

TEST(HttpStore, S3WritesListsPageByPageAndErases) {
  TestServer server;
  server.put("bucket/other.zarr/zarr.json", "{}");
  auto store = make_http_store(s3_options(server, "era5.zarr"));
  for (const char* key : {"zarr.json", "t/zarr.json", "t/c/0/0", "t/c/0/1", "t/c/1/0", "u/&x"}) {
    store->set(key, as_bytes(std::string("value of ") + key));
  }
  EXPECT_EQ(server.object("bucket/era5.zarr/t/c/0/1"), "value of t/c/0/1");
  EXPECT_EQ(text(*store->get("u/&x")), "value of u/&x");
  EXPECT_EQ(store->list(""), (std::vector<std::string>{"t/c/0/0", "t/c/0/1", "t/c/1/0",
                                                       "t/zarr.json", "u/&x", "zarr.json"}));
  EXPECT_EQ(store->list("t/c/"), (std::vector<std::string>{"t/c/0/0", "t/c/0/1", "t/c/1/0"}));
  EXPECT_EQ(store->list_dir(""), (std::vector<std::string>{"t", "u", "zarr.json"}));
  const auto sized = store->list_sizes("t/c/1");
  ASSERT_EQ(sized.size(), 1u);
  EXPECT_EQ(sized[0], (std::pair<std::string, uint64_t>{"t/c/1/0", 16}));
  EXPECT_TRUE(store->can_list());
  store->erase("t/c/0/0");
  store->erase("t/c/0/0");  // a missing key is fine
  EXPECT_FALSE(store->get("t/c/0/0"));
  store->erase_prefix("t/");
  EXPECT_EQ(store->list(""), (std::vector<std::string>{"u/&x", "zarr.json"}));
  EXPECT_EQ(server.object("bucket/other.zarr/zarr.json"), "{}");
}

TEST(HttpStore, ReadsManyAtOnce) {
  TestServer server;
  std::vector<KeyRange> requests;
  for (int i = 0; i < 64; ++i) {
    server.put("k" + std::to_string(i), "value " + std::to_string(i));
    requests.push_back({"k" + std::to_string(i), ByteRange::all()});
  }
  requests.push_back({"missing", ByteRange::all()});
  auto store = make_http_store(quick(server.url()));
  auto values = store->get_many(requests);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(text(*values[i]), "value " + std::to_string(i));
  EXPECT_FALSE(values[64]);
  EXPECT_GT(server.max_in_flight.load(), 1);
}

TEST(HttpStore, AForkedChildOpensItsOwnConnections) {
  // A DataLoader worker forked after the parent read: the parent's kept connections are its
  // own, the child reads (many at once, on the I/O pool) through new ones, and the parent's go
  // on working after.
  TestServer server;
  std::vector<KeyRange> requests;
  for (int i = 0; i < 40; ++i) {
    server.put("k" + std::to_string(i), "value " + std::to_string(i));
    requests.push_back({"k" + std::to_string(i), ByteRange::all()});
  }
  auto store = make_http_store(quick(server.url()));
  ASSERT_EQ(store->get_many(requests).size(), 40u);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      const auto values = store->get_many(requests);
      for (int i = 0; i < 40; ++i) {
        if (!values[i] || text(*values[i]) != "value " + std::to_string(i)) ::_exit(2);
      }
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const auto values = store->get_many(requests);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(text(*values[i]), "value " + std::to_string(i));
}

TEST(HttpStore, AnInnerChunkOfAShardIsTwoRequests) {
  TestServer server;
  auto store = make_http_store(s3_options(server, "x.zarr"));
  const Json metadata = {
      {"zarr_format", 3},
      {"node_type", "array"},
      {"shape", {16, 16}},
      {"data_type", "float32"},
      {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", {8, 8}}}}}},
      {"chunk_key_encoding", {{"name", "default"}}},
      {"fill_value", 0},
      {"codecs", Json::parse(R"([{"name": "sharding_indexed", "configuration": {
          "chunk_shape": [4, 4], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
          {"name": "zstd"}]}}])")}};
  auto array = zarr::Array::create(store, "t", zarr::ArrayMetadata::parse_v3(metadata));
  std::vector<float> values(256);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i);
  array.write(array.full_selection(), values.data());
  server.requests = 0;
  float one = 0;
  array.read({{9, 10, 1}, {13, 14, 1}}, &one);
  EXPECT_EQ(one, values[9 * 16 + 13]);
  // The index (its response says the shard's size, which bounds its entries) and the inner chunk:
  // no HEAD in between.
  EXPECT_EQ(server.requests.load(), 2);
}

TEST(HttpStore, ListsAGroupsMembersWithoutListingTheirChunks) {
  TestServer server;
  for (int i = 0; i < 40; ++i) server.put("bucket/g.zarr/t2m/c/" + std::to_string(i), "x");
  server.put("bucket/g.zarr/t2m/zarr.json", "{}");
  server.put("bucket/g.zarr/zarr.json", "{}");
  server.put("bucket/g.zarr/sub/u/zarr.json", "{}");
  server.put("bucket/g.zarr/sub/", "");          // a console's folder marker
  server.put("bucket/g.zarr2/zarr.json", "{}");  // a sibling store
  auto store = make_http_store(s3_options(server, "g.zarr"));
  server.requests = 0;
  EXPECT_EQ(store->list_dir(""), (std::vector<std::string>{"sub", "t2m", "zarr.json"}));
  EXPECT_EQ(server.requests.load(), 2);  // two entries a page here: not the 40 chunks' 21
  EXPECT_EQ(store->list_dir("sub/"), (std::vector<std::string>{"u"}));
  EXPECT_EQ(store->list_dir("t2m/").size(), 2u);  // "c" and zarr.json
}

TEST(HttpStore, AUrlsPasswordAndQueryStayOutOfMessages) {
  const auto options = http_store_options("https://user:s3cret@example.com/data.zarr/?sig=abc");
  EXPECT_EQ(options.display_url, "https://example.com/data.zarr");
  EXPECT_EQ(options.base_url, "https://user:s3cret@example.com/data.zarr");
  EXPECT_EQ(http_store_options("https://example.com/a@b/data.zarr").display_url,
            "https://example.com/a@b/data.zarr");
}

TEST(HttpStore, OptionsFromUrls) {
  // No profile files: what a developer's ~/.aws holds must not change the outcome.
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials", 1);
  ::setenv("AWS_CONFIG_FILE", "/nonexistent/config", 1);
  ::unsetenv("AWS_PROFILE");
  ::setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
  ::setenv("AWS_REGION", "eu-west-1", 1);
  ::setenv("AWS_ACCESS_KEY_ID", "key", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
  auto s3 = http_store_options("s3://my-bucket/data/era5.zarr/");
  EXPECT_TRUE(s3.s3);
  EXPECT_EQ(s3.bucket_url, "http://127.0.0.1:9000/my-bucket");
  EXPECT_EQ(s3.base_url, "http://127.0.0.1:9000/my-bucket/data/era5.zarr");
  EXPECT_EQ(s3.key_prefix, "data/era5.zarr/");
  EXPECT_EQ(s3.display_url, "s3://my-bucket/data/era5.zarr");
  EXPECT_EQ(s3.region, "eu-west-1");
  EXPECT_EQ(s3.access_key, "key");
  for (const char* yes : {"true", "True", "YES", "1", "on"}) {
    ::setenv("AWS_NO_SIGN_REQUEST", yes, 1);
    EXPECT_EQ(http_store_options("s3://b").access_key, "") << yes;
  }
  ::setenv("AWS_NO_SIGN_REQUEST", "false", 1);
  EXPECT_EQ(http_store_options("s3://b").access_key, "key");
  ::unsetenv("AWS_NO_SIGN_REQUEST");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  EXPECT_THROW(http_store_options("s3://b"), Error);
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_ENDPOINT_URL");
  auto aws = http_store_options("s3://b");
  EXPECT_EQ(aws.bucket_url, "https://s3.eu-west-1.amazonaws.com/b");
  EXPECT_EQ(aws.key_prefix, "");
  ::unsetenv("AWS_REGION");
  auto google = http_store_options("gs://gcp-public-data-arco-era5/ar/full.zarr");
  EXPECT_EQ(google.base_url,
            "https://storage.googleapis.com/gcp-public-data-arco-era5/ar/full.zarr");
  EXPECT_EQ(google.display_url, "gs://gcp-public-data-arco-era5/ar/full.zarr");
  EXPECT_EQ(google.access_key, "");
  auto plain = http_store_options("https://example.org/a%20b/x.zarr/");
  EXPECT_FALSE(plain.s3);
  EXPECT_EQ(plain.base_url, "https://example.org/a%20b/x.zarr");
  EXPECT_THROW(http_store_options("s3:///x"), Error);
  EXPECT_THROW(http_store_options("s3://b/../x"), Error);
  EXPECT_THROW(http_store_options("ftp://host/x"), UnsupportedError);
  EXPECT_THROW(open_store("ftp://host/x"), UnsupportedError);
  EXPECT_EQ(open_store("https://example.org/x.zarr")->url(), "https://example.org/x.zarr");
  EXPECT_GT(open_store("https://example.org/x.zarr")->read_concurrency(), 1u);
  EXPECT_EQ(percent_encode("a b/c~d&", true), "a%20b/c~d%26");
  EXPECT_EQ(percent_encode("a/b", false), "a%2Fb");
  ::unsetenv("AWS_SHARED_CREDENTIALS_FILE");
  ::unsetenv("AWS_CONFIG_FILE");
}

TEST(HttpStore, CredentialsAndRegionFromTheAwsProfileFiles) {
  zfeed::testing::TempDir dir;
  const std::string credentials = dir.path() + "/credentials";
  const std::string config = dir.path() + "/config";
  std::ofstream(credentials) << "# keys\n[default]\naws_access_key_id = AKIADEFAULT\n"
                                "aws_secret_access_key=default-secret\n\n[training]\n"
                                "aws_access_key_id = AKIATRAINING\naws_secret_access_key = s\n"
                                "aws_session_token = token\n";
  std::ofstream(config) << "[default]\nregion = eu-central-1\n[profile training]\n"
                           "region = us-west-2\nendpoint_url = http://127.0.0.1:9000\n";
  for (const char* name : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                           "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
                           "AWS_ENDPOINT_URL_S3", "AWS_NO_SIGN_REQUEST", "AWS_PROFILE"}) {
    ::unsetenv(name);
  }
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", credentials.c_str(), 1);
  ::setenv("AWS_CONFIG_FILE", config.c_str(), 1);
  auto options = http_store_options("s3://b/x");
  EXPECT_EQ(options.access_key, "AKIADEFAULT");
  EXPECT_EQ(options.secret_key, "default-secret");
  EXPECT_EQ(options.region, "eu-central-1");
  EXPECT_EQ(options.bucket_url, "https://s3.eu-central-1.amazonaws.com/b");
  ::setenv("AWS_PROFILE", "training", 1);
  options = http_store_options("s3://b/x");
  EXPECT_EQ(options.access_key, "AKIATRAINING");
  EXPECT_EQ(options.session_token, "token");
  EXPECT_EQ(options.region, "us-west-2");
  EXPECT_EQ(options.bucket_url, "http://127.0.0.1:9000/b");
  // The environment wins over the files.
  ::setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "env-secret", 1);
  ::setenv("AWS_REGION", "ap-south-1", 1);
  options = http_store_options("s3://b/x");
  EXPECT_EQ(options.access_key, "AKIAENV");
  EXPECT_EQ(options.session_token, "");
  EXPECT_EQ(options.region, "ap-south-1");
  ::setenv("AWS_PROFILE", "nobody", 1);
  EXPECT_CONTAINS(error_of<Error>([] { http_store_options("s3://b/x"); }),
                  "AWS_PROFILE=nobody: no such profile in " + credentials);
  for (const char* name : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",
                           "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"}) {
    ::unsetenv(name);
  }
}

TEST(HttpStore, ParsesObjectListings) {
  auto page = parse_list_objects(
      "<?xml version=\"1.0\"?><ListBucketResult><Contents><Key>a&amp;b&#47;&#x63;</Key>"
      "<Size>1</Size></Contents><Contents><Key>t/c/0</Key><Size>123456789012</Size></Contents>"
      "<IsTruncated>true"
      "</IsTruncated><NextContinuationToken>tok&lt;en</NextContinuationToken>"
      "</ListBucketResult>");
  EXPECT_EQ(page.keys, (std::vector<std::string>{"a&b/c", "t/c/0"}));
  EXPECT_EQ(page.sizes, (std::vector<uint64_t>{1, 123456789012}));
  EXPECT_TRUE(page.truncated);
  EXPECT_EQ(page.next_token, "tok<en");
  EXPECT_TRUE(parse_list_objects("<ListBucketResult></ListBucketResult>").keys.empty());
  EXPECT_THROW(parse_list_objects("<ListBucketResult><Contents><Key>k</Key></Contents>"), Error);
  EXPECT_THROW(parse_list_objects("<html>oops</html>"), Error);
  EXPECT_THROW(parse_list_objects("<ListBucketResult><Contents><Key>x</Key>"), Error);
  EXPECT_THROW(parse_list_objects("<ListBucketResult><Contents><Size>1</Size></Contents>"), Error);
  EXPECT_THROW(parse_list_objects("<ListBucketResult><Contents><Key>&bogus;</Key></Contents>"),
               Error);
  EXPECT_THROW(parse_list_objects("<ListBucketResult><Contents><Key>k</Key><Size>-1</Size>"
                                  "</Contents>"),
               Error);
  EXPECT_THROW(
      parse_list_objects("<ListBucketResult><Contents><Key>&#0;</Key><Size>1</Size></Contents>"),
      Error);
}

TEST(HttpStore, ATokenUrlKeepsItsQueryAfterEachKey) {
  TestServer server;
  server.put("data/t/c/0", "0123456789");
  auto store = make_http_store(quick(server.url() + "/data?sv=1&sig=abc"));
  EXPECT_EQ(text(*store->get("t/c/0")), "0123456789");
  EXPECT_EQ(server.last_query, "sv=1&sig=abc");
  EXPECT_EQ(store->url(), server.url() + "/data");  // the query may hold a secret
}

TEST(HttpStore, APartialResponseWithAnUnknownTotalServesARange) {
  TestServer server;
  server.put("k", "0123456789");
  server.unknown_total = true;
  auto store = make_http_store(quick(server.url()));
  EXPECT_EQ(text(*store->get("k", ByteRange::range(2, 3))), "234");
  EXPECT_EQ(text(*store->get("k", ByteRange::suffix(3))), "789");
}

TEST(HttpStore, FolderMarkersAreNoKeys) {
  TestServer server;
  server.put("bucket/era5.zarr/", "");
  server.put("bucket/era5.zarr/temp/", "");
  server.put("bucket/era5.zarr/zarr.json", "{}");
  auto store = make_http_store(s3_options(server, "era5.zarr"));
  EXPECT_EQ(store->list(""), (std::vector<std::string>{"zarr.json"}));
}

}  // namespace
}  // namespace zfeed
