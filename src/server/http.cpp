// Router dispatch and the cpp-httplib transport. Every route is registered under one catch-all
// pattern per method so that the Router alone decides between 404 and 405.
#include "server/http.h"

#include <httplib.h>

#include <atomic>
#include <memory>

#include "dsinfer/error.h"

namespace dsi::server {

Router::Router(ErrorFormatter format_error) : format_error_(std::move(format_error)) {}

void Router::add(const std::string& method, const std::string& path, Handler handler) {
  routes_[path][method] = std::move(handler);
}

HttpResponse Router::dispatch(const HttpRequest& request) const {
  try {
    const auto p = routes_.find(request.path);
    if (p == routes_.end())
      return format_error_(404, "no route for " + request.method + " " + request.path);
    auto m = p->second.find(request.method);
    if (m == p->second.end() && request.method == "HEAD") m = p->second.find("GET");
    if (m == p->second.end()) {
      std::string allowed;
      for (const auto& [method, h] : p->second) allowed += (allowed.empty() ? "" : ", ") + method;
      HttpResponse r = format_error_(405, "method " + request.method + " is not allowed on " +
                                              request.path + " (allowed: " + allowed + ")");
      r.headers.emplace_back("Allow", allowed);
      return r;
    }
    return m->second(request);
  } catch (const std::exception& e) {
    try {
      return format_error_(500, std::string("internal error: ") + e.what());
    } catch (...) {
    }
  } catch (...) {
  }
  HttpResponse r;
  r.status = 500;
  r.body = R"({"error":{"message":"internal error","type":"internal_error","param":null,"code":null}})";
  return r;
}

struct HttpServer::Impl {
  const Router& router;
  HttpServerOptions options;
  httplib::Server server;
  Impl(const Router& r, HttpServerOptions o) : router(r), options(std::move(o)) {}
};

namespace {

void serve_one(const Router& router, const httplib::Request& req, httplib::Response& res) {
  HttpRequest request{req.method, req.path, req.body};
  HttpResponse r = router.dispatch(request);
  res.status = r.status;
  for (auto& [k, v] : r.headers) res.set_header(k, v);
  if (!r.stream) {
    res.set_content(std::move(r.body), r.content_type.c_str());
    return;
  }
  // on_close must run once on every path: the releaser runs when httplib is done with the provider
  // (finished or not); a shared guard also runs it if httplib never calls either.
  struct CloseOnce {
    std::function<void()> fn;
    std::atomic<bool> done{false};
    void run() noexcept {
      if (!done.exchange(true) && fn) {
        try {
          fn();
        } catch (...) {
        }
      }
    }
    ~CloseOnce() { run(); }
  };
  auto close = std::make_shared<CloseOnce>();
  close->fn = std::move(r.on_close);
  auto stream = std::make_shared<std::function<bool(const ChunkWriter&)>>(std::move(r.stream));
  res.set_chunked_content_provider(
      r.content_type,
      [stream, close](size_t /*offset*/, httplib::DataSink& sink) -> bool {
        bool client_ok = true;
        const ChunkWriter write = [&](std::string_view piece) -> bool {
          if (piece.empty()) return client_ok;  // an empty write would end httplib's stream
          if (!client_ok || !sink.is_writable() || !sink.write(piece.data(), piece.size()))
            client_ok = false;
          return client_ok;
        };
        bool more = false;
        try {
          more = (*stream)(write);
        } catch (...) {
          client_ok = false;  // a stream must not throw; end the connection if one does
        }
        if (!client_ok) return false;  // disconnect: httplib drops the connection
        if (!more) sink.done();
        return true;
      },
      [close](bool /*success*/) { close->run(); });
}

}  // namespace

HttpServer::HttpServer(const Router& router, HttpServerOptions options)
    : impl_(new Impl(router, std::move(options))) {
  auto& s = impl_->server;
  const int threads = impl_->options.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  s.set_payload_max_length(size_t(64) << 20);
  s.set_keep_alive_timeout(2);
  s.set_read_timeout(30);
  s.set_write_timeout(30);
  const Router& r = impl_->router;
  auto h = [&r](const httplib::Request& req, httplib::Response& res) { serve_one(r, req, res); };
  const char* any = R"(/.*)";
  s.Get(any, h);
  s.Post(any, h);
  s.Put(any, h);
  s.Patch(any, h);
  s.Delete(any, h);
  s.Options(any, h);
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    res.status = 500;
    res.set_content(R"({"error":{"message":"internal error","type":"internal_error","param":null,"code":null}})",
                    "application/json");
  });
}

HttpServer::~HttpServer() {
  stop();
  delete impl_;
}

int HttpServer::bind() {
  auto& s = impl_->server;
  const auto& o = impl_->options;
  if (o.port == 0) {
    port_ = s.bind_to_any_port(o.host);
    if (port_ <= 0) fail("cannot listen on {} (any port)", o.host);
  } else {
    if (!s.bind_to_port(o.host, o.port)) fail("cannot listen on {}:{} (in use?)", o.host, o.port);
    port_ = o.port;
  }
  return port_;
}

void HttpServer::serve() { impl_->server.listen_after_bind(); }

void HttpServer::stop() {
  if (impl_->server.is_running()) impl_->server.stop();
}

}  // namespace dsi::server
