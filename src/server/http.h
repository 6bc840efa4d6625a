// The HTTP layer's vocabulary, free of any model or OpenAI notion: a request, a response that is
// either a body or a stream of chunks, and the router that maps (method, path) to a handler with
// 404 for an unknown path and 405 for a known path with another method.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dsi::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query string
  std::string body;
};

// Writes one piece of a streamed body; false once the client is gone (the stream must then stop).
using ChunkWriter = std::function<bool(std::string_view)>;

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // A streamed response (chunked transfer encoding) when set: called again and again with the
  // writer until it returns false (done, or the client disconnected). `on_close` runs exactly once
  // afterwards, on every path (finished, disconnected, server stopping); it must not throw.
  std::function<bool(const ChunkWriter&)> stream;
  std::function<void()> on_close;
};

using Handler = std::function<HttpResponse(const HttpRequest&)>;
// Formats an error the router produces itself (unknown path, wrong method, a handler that threw).
using ErrorFormatter = std::function<HttpResponse(int status, const std::string& message)>;

class Router {
 public:
  explicit Router(ErrorFormatter format_error);
  void add(const std::string& method, const std::string& path, Handler handler);
  // Never throws: a handler that throws gives a 500 from the error formatter.
  HttpResponse dispatch(const HttpRequest& request) const;

 private:
  std::map<std::string, std::map<std::string, Handler>> routes_;  // path -> method -> handler
  ErrorFormatter format_error_;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see HttpServer::port())
  int threads = 64;  // connections served at once (each streaming client holds one)
};

// The cpp-httplib server around a Router.
class HttpServer {
 public:
  HttpServer(const Router& router, HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the socket; throws dsi::Error naming host:port when that fails. Returns the port.
  int bind();
  int port() const { return port_; }
  // Serves until stop() (from any thread); returns after every connection's handler has returned.
  void serve();
  void stop();

 private:
  struct Impl;
  Impl* impl_;
  int port_ = 0;
};

}  // namespace dsi::server
