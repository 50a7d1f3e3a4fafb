//! `gpuplace-loadgen`: the open-loop load generator of `benches/bench_serve.py`, compiled.
//!
//! It sends exactly the request sequence of the bench's Python generator (`_open_loop`):
//! request i is due at start + i / rate (start: 0.2 s after the connections are open), even
//! ones place an 8-GPU job, odd ones release the job `--keep` placements back once more than
//! `--keep` are placed. Latency is counted from the due time, so a request that waits for a
//! free connection, or for a generator that fell behind, is charged for it (open loop).
//!
//! Built for little CPU, since it shares the machine it measures: one thread per keep-alive
//! Unix-socket connection (blocking I/O, one request in flight each); a thread whose connection
//! is free takes the next request of the schedule, sleeps until it is due, sends it and reads
//! the answer by its Content-Length. Two wake-ups per request (the due time, the answer) and
//! no hand-off between threads. Measured against alternatives on the development machine (a
//! fixed-answer server, 1,000 requests/s): a scheduler thread passing each request to a
//! connection thread took about twice the CPU per request (five context switches per request
//! instead of about four, each costly on a virtual machine), and one thread driving every
//! connection through epoll about 1.7x (125-146 against 72-92 us). It prints one JSON line and exits 0; bad arguments, a
//! socket that cannot be connected to or does not answer: a message and exit code 2.

mod http;
mod plan;
mod stats;

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: gpuplace-loadgen --socket PATH --rate R --seconds S \
[--connections 64] [--prefix r] [--keep 1024] [--timeout 10]";

/// The key under which requests that got no answer (the connection failed) are counted.
const CONNECTION_ERROR: &str = "connection_error";

#[derive(Debug, PartialEq)]
struct Options {
    socket: PathBuf,
    /// Requests per second.
    rate: f64,
    /// Seconds of requests: int(rate x seconds) requests in all.
    seconds: f64,
    connections: usize,
    prefix: String,
    keep: usize,
    /// Seconds to wait for one answer before giving up on the service.
    timeout: f64,
}

/// `Ok(None)`: `--help`.
fn parse_args(args: &[String]) -> Result<Option<Options>, String> {
    let mut socket = None;
    let mut rate = None;
    let mut seconds = None;
    let mut connections = 64usize;
    let mut prefix = "r".to_string();
    let mut keep = 1024usize;
    let mut timeout = 10.0;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(None);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        if !matches!(
            flag,
            "--socket"
                | "--rate"
                | "--seconds"
                | "--connections"
                | "--prefix"
                | "--keep"
                | "--timeout"
        ) {
            return Err(format!("unknown argument {arg:?}"));
        }
        let value = match inline {
            Some(value) => value,
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))?,
        };
        match flag {
            "--socket" => socket = Some(PathBuf::from(value)),
            "--rate" => rate = Some(positive(flag, &value, "requests per second")?),
            "--seconds" => seconds = Some(positive(flag, &value, "seconds")?),
            "--timeout" => timeout = positive(flag, &value, "seconds")?,
            "--connections" => connections = count(flag, &value)?,
            "--keep" => keep = count(flag, &value)?,
            _ => prefix = value,
        }
    }
    let socket = socket.ok_or("--socket PATH is required (the service's Unix socket)")?;
    let rate = rate.ok_or("--rate R is required (requests per second)")?;
    let seconds = seconds.ok_or("--seconds S is required")?;
    if seconds > 1e6 {
        return Err("--seconds: at most 1000000 (11.6 days)".to_string());
    }
    let total = rate * seconds;
    if total < 1.0 {
        return Err(format!(
            "--rate {rate} x --seconds {seconds} is less than one request"
        ));
    }
    if total > 1e8 {
        return Err(format!(
            "--rate {rate} x --seconds {seconds} is {total:.0} requests; at most 100,000,000"
        ));
    }
    Ok(Some(Options {
        socket,
        rate,
        seconds,
        connections,
        prefix,
        keep,
        timeout,
    }))
}

fn positive(flag: &str, value: &str, unit: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "{flag}: expected a positive number of {unit}, got {value:?}"
        )),
    }
}

fn count(flag: &str, value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(v) if (1..=100_000).contains(&v) => Ok(v),
        _ => Err(format!(
            "{flag}: expected a whole number from 1 to 100000, got {value:?}"
        )),
    }
}

/// The requests and when each is due; connection threads take them in order.
struct Schedule {
    start: Instant,
    /// Requests per second.
    rate: f64,
    frames: Vec<Vec<u8>>,
    places: Vec<bool>,
    next: AtomicUsize,
}

impl Schedule {
    /// The first request not yet taken, and when it is due; `None` once every one is taken.
    /// A thread takes one only when its connection is free, so the oldest request waiting
    /// goes to the first connection that comes free, as the Python generator's pool of
    /// connections hands them out.
    fn take(&self) -> Option<(usize, Instant)> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        (index < self.frames.len()).then(|| {
            (
                index,
                self.start + Duration::from_secs_f64(index as f64 / self.rate),
            )
        })
    }
}

/// What one connection thread saw.
#[derive(Default)]
struct Tally {
    /// Seconds from due to answered, of every answered request (non-200 included, as in the
    /// Python generator), and of the placements among them.
    all: Vec<f64>,
    place: Vec<f64>,
    failures: BTreeMap<String, u64>,
    first_error: Option<String>,
}

struct Connection {
    socket: PathBuf,
    timeout: Duration,
    stream: Option<UnixStream>,
    buffer: Vec<u8>,
}

impl Connection {
    fn open(socket: &Path, timeout: Duration) -> io::Result<Connection> {
        let mut connection = Connection {
            socket: socket.to_path_buf(),
            timeout,
            stream: None,
            buffer: Vec::with_capacity(4096),
        };
        connection.stream = Some(connection.connect()?);
        Ok(connection)
    }

    fn connect(&self) -> io::Result<UnixStream> {
        let stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(self.timeout))?;
        stream.set_write_timeout(Some(self.timeout))?;
        Ok(stream)
    }

    /// Sends one request and reads its answer's status. After a failure the connection is
    /// dropped and the next request opens a new one (as a client of the service would).
    fn exchange(&mut self, frame: &[u8]) -> io::Result<u16> {
        if self.stream.is_none() {
            self.stream = Some(self.connect()?);
            self.buffer.clear();
        }
        let stream = self.stream.as_mut().expect("connected above");
        let result = stream
            .write_all(frame)
            .and_then(|()| http::read_response(stream, &mut self.buffer));
        if result.is_err() {
            self.stream = None;
        }
        result
    }
}

/// Sends requests on `connection` until every one is taken: each one at its due time (the
/// thread sleeps until then), or at once if it is late (every connection was busy).
fn serve(mut connection: Connection, schedule: &Schedule) -> Tally {
    let mut tally = Tally::default();
    while let Some((index, due)) = schedule.take() {
        let wait = due.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            thread::sleep(wait);
        }
        match connection.exchange(&schedule.frames[index]) {
            Ok(status) => {
                let latency = due.elapsed().as_secs_f64();
                tally.all.push(latency);
                if schedule.places[index] {
                    tally.place.push(latency);
                }
                if status != 200 {
                    *tally.failures.entry(status.to_string()).or_default() += 1;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                eprintln!(
                    "gpuplace-loadgen: {} did not answer request {index} within {:?}",
                    connection.socket.display(),
                    connection.timeout
                );
                std::process::exit(2);
            }
            Err(e) => {
                *tally
                    .failures
                    .entry(CONNECTION_ERROR.to_string())
                    .or_default() += 1;
                tally
                    .first_error
                    .get_or_insert_with(|| format!("request {index}: {e}"));
            }
        }
    }
    tally
}

fn run(options: &Options) -> Result<String, String> {
    let total = (options.rate * options.seconds) as usize; // int() in Python: truncation
    let actions = plan::sequence(options.rate, total, &options.prefix, options.keep);
    let frames: Vec<Vec<u8>> = actions.iter().map(plan::Action::frame).collect();
    let places: Vec<bool> = actions.iter().map(plan::Action::is_place).collect();
    drop(actions);
    let timeout = Duration::from_secs_f64(options.timeout);
    let mut connections = Vec::with_capacity(options.connections);
    for _ in 0..options.connections {
        connections.push(
            Connection::open(&options.socket, timeout)
                .map_err(|e| format!("cannot connect to {}: {e}", options.socket.display()))?,
        );
    }
    let schedule = Arc::new(Schedule {
        start: Instant::now() + Duration::from_millis(200),
        rate: options.rate,
        frames,
        places,
        next: AtomicUsize::new(0),
    });
    let workers: Vec<_> = connections
        .into_iter()
        .map(|connection| {
            let schedule = schedule.clone();
            thread::Builder::new()
                .name("connection".to_string())
                .stack_size(256 * 1024)
                .spawn(move || serve(connection, &schedule))
                .map_err(|e| format!("cannot start a connection thread: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut tally = Tally::default();
    for worker in workers {
        let part = worker
            .join()
            .map_err(|_| "a connection thread failed".to_string())?;
        tally.all.extend(part.all);
        tally.place.extend(part.place);
        for (key, n) in part.failures {
            *tally.failures.entry(key).or_default() += n;
        }
        if tally.first_error.is_none() {
            tally.first_error = part.first_error;
        }
    }
    let elapsed = schedule.start.elapsed().as_secs_f64();
    if let Some(first) = &tally.first_error {
        eprintln!(
            "gpuplace-loadgen: {} requests got no answer (first: {first})",
            tally.failures[CONNECTION_ERROR]
        );
    }
    if tally.all.is_empty() {
        return Err(format!(
            "{} answered none of {total} requests",
            options.socket.display()
        ));
    }
    let placements = tally.place.len();
    let ms = |values: &mut Vec<f64>, q: f64| json_number(stats::percentile(values, q) * 1e3);
    let failures = tally
        .failures
        .iter()
        .map(|(key, n)| format!("{}: {n}", plan::json_string(key)))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(format!(
        "{{\"rate\": {}, \"requests\": {total}, \"achieved\": {}, \"place_p50_ms\": {}, \
         \"place_p99_ms\": {}, \"all_p50_ms\": {}, \"all_p99_ms\": {}, \"failures\": {{{failures}}}, \
         \"placements\": {placements}, \"connections\": {}, \"cpu_seconds\": {}}}",
        json_number(options.rate),
        json_number(total as f64 / elapsed),
        ms(&mut tally.place, 50.0),
        ms(&mut tally.place, 99.0),
        ms(&mut tally.all, 50.0),
        ms(&mut tally.all, 99.0),
        options.connections,
        stats::own_cpu_seconds().map_or("null".to_string(), json_number),
    ))
}

/// A JSON number (`null` for NaN or infinity, which JSON has no number for).
fn json_number(value: f64) -> String {
    if value.is_finite() {
        format!("{value}")
    } else {
        "null".to_string()
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse_args(&args) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("gpuplace-loadgen: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("gpuplace-loadgen: {message}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn arguments_with_defaults() {
        let options = parse_args(&args("--socket s.sock --rate 1000 --seconds=5"))
            .unwrap()
            .unwrap();
        assert_eq!(
            options,
            Options {
                socket: PathBuf::from("s.sock"),
                rate: 1000.0,
                seconds: 5.0,
                connections: 64,
                prefix: "r".to_string(),
                keep: 1024,
                timeout: 10.0,
            }
        );
        let options = parse_args(&args(
            "--socket s --rate 2.5 --seconds 4 --connections 8 --prefix warm --keep 3",
        ))
        .unwrap()
        .unwrap();
        assert_eq!((options.connections, options.keep), (8, 3));
        assert_eq!(options.prefix, "warm");
        assert_eq!(parse_args(&args("--help")).unwrap(), None);
    }

    #[test]
    fn bad_arguments_say_what_was_expected() {
        let cases = [
            ("--rate 10 --seconds 1", "--socket PATH is required"),
            (
                "--socket s --rate fast --seconds 1",
                "--rate: expected a positive number",
            ),
            (
                "--socket s --rate -1 --seconds 1",
                "--rate: expected a positive number",
            ),
            (
                "--socket s --rate 10 --seconds inf",
                "--seconds: expected a positive number",
            ),
            (
                "--socket s --rate 10 --seconds 1 --keep 0",
                "--keep: expected a whole number",
            ),
            (
                "--socket s --rate 10 --seconds 1 --connections",
                "--connections needs a value",
            ),
            (
                "--socket s --rate 10 --seconds 1 --rps 3",
                "unknown argument \"--rps\"",
            ),
            ("--socket s --rate 0.5 --seconds 1", "less than one request"),
            (
                "--socket s --rate 1e-300 --seconds 1e301",
                "--seconds: at most 1000000",
            ),
        ];
        for (line, want) in cases {
            let err = parse_args(&args(line)).unwrap_err();
            assert!(err.contains(want), "{line}: {err}");
        }
    }

    #[test]
    fn a_missing_socket_is_an_error_not_a_panic() {
        let options = parse_args(&args(
            "--socket /nonexistent/gpuplace-loadgen.sock --rate 10 --seconds 1",
        ))
        .unwrap()
        .unwrap();
        let err = run(&options).unwrap_err();
        assert!(err.starts_with("cannot connect to /nonexistent/"), "{err}");
    }

    /// A stand-in service on a Unix socket: answers placements 200 and releases 404, and
    /// closes the connection instead of answering the placement named `drop_name`; records
    /// every request it read.
    fn fake_service(path: PathBuf, drop_name: &'static str) -> Arc<Mutex<Vec<Vec<u8>>>> {
        use std::io::Read;
        use std::os::unix::net::UnixListener;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let listener = UnixListener::bind(path).unwrap();
        let record = seen.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let (mut stream, record) = (stream.unwrap(), record.clone());
                thread::spawn(move || {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        // One request: head, then Content-Length bytes of body.
                        let request = loop {
                            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                                let head = String::from_utf8_lossy(&buffer[..end]).to_string();
                                let length: usize = head
                                    .split("\r\n")
                                    .find_map(|l| l.strip_prefix("Content-Length: "))
                                    .unwrap()
                                    .parse()
                                    .unwrap();
                                if buffer.len() >= end + 4 + length {
                                    break buffer.drain(..end + 4 + length).collect::<Vec<u8>>();
                                }
                            }
                            match stream.read(&mut chunk) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let text = String::from_utf8_lossy(&request).to_string();
                        record.lock().unwrap().push(request);
                        if text.contains(&format!("\"name\": \"{drop_name}\"")) {
                            return;
                        }
                        let answer: &[u8] = if text.starts_with("POST /v1/place ") {
                            b"HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n{\"held\": true}"
                        } else {
                            b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}"
                        };
                        stream.write_all(answer).unwrap();
                    }
                });
            }
        });
        seen
    }

    #[test]
    fn sends_the_sequence_and_counts_answers_and_failures() {
        let dir =
            std::env::temp_dir().join(format!("gpuplace-loadgen-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("service.sock");
        let _ = std::fs::remove_file(&socket);
        let seen = fake_service(socket.clone(), "t400-6");
        let options = Options {
            socket,
            rate: 400.0,
            seconds: 0.05, // 20 requests
            connections: 3,
            prefix: "t".to_string(),
            keep: 2,
            timeout: 10.0,
        };
        let line = run(&options).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let mut sent: Vec<Vec<u8>> = seen.lock().unwrap().clone();
        let mut want: Vec<Vec<u8>> = plan::sequence(400.0, 20, "t", 2)
            .iter()
            .map(plan::Action::frame)
            .collect();
        sent.sort();
        want.sort();
        assert_eq!(sent, want, "every request of the sequence, once");
        // 20 requests: 0, 1, 2 place, then odd ones release (9 releases answered 404); the
        // placement t400-6 got no answer.
        for part in [
            "\"requests\": 20,",
            "\"failures\": {\"404\": 9, \"connection_error\": 1}",
            "\"placements\": 10,",
            "\"connections\": 3,",
        ] {
            assert!(line.contains(part), "{part} not in {line}");
        }
        assert!(line.contains("\"cpu_seconds\": "), "{line}");
    }

    #[test]
    fn json_numbers() {
        assert_eq!(json_number(1000.0), "1000");
        assert_eq!(json_number(1.25), "1.25");
        assert_eq!(json_number(f64::NAN), "null");
    }
}
