//! From an import name to the PyPI distribution that provides it.

use crate::requirement::normalize_name;

/// Namespace packages whose first component says nothing about the distribution, and how many
/// components of a dotted import do (`google.protobuf` → 2, `google.cloud.storage` → 3). The longest
/// matching prefix wins.
const NAMESPACES: &[(&str, usize)] = &[
    ("google", 2),
    ("google.cloud", 3),
    ("azure", 2),
    ("azure.ai", 3),
    ("azure.mgmt", 3),
    ("azure.storage", 3),
    ("backports", 2),
    ("jaraco", 2),
    ("mysql", 2),
    ("ruamel", 2),
    ("snowflake", 2),
    ("zope", 2),
];

/// Import names whose distribution is not the import name itself (after PEP 503 normalization, which
/// the fallback applies: `typing_extensions` → `typing-extensions` needs no entry). Distribution names
/// are written normalized.
const DISTRIBUTIONS: &[(&str, &str)] = &[
    // Pillow docs, "Installation": `pip install Pillow`, then `from PIL import Image`.
    ("PIL", "pillow"),
    // scikit-learn docs, "Installing scikit-learn": `pip install scikit-learn`, imported as `sklearn`.
    ("sklearn", "scikit-learn"),
    // scikit-image docs, "Installing scikit-image": `pip install scikit-image`, imported as `skimage`.
    ("skimage", "scikit-image"),
    // PyPI project page "PyYAML": provides the `yaml` module.
    ("yaml", "pyyaml"),
    // PyPI project page "opencv-python": main modules, imported as `cv2`.
    ("cv2", "opencv-python"),
    // PyPI project page "beautifulsoup4": `from bs4 import BeautifulSoup`.
    ("bs4", "beautifulsoup4"),
    // PyPI project page "python-dateutil": provides the `dateutil` package.
    ("dateutil", "python-dateutil"),
    // attrs docs, "Overview": the classic API lives in the `attr` package of the `attrs` distribution.
    ("attr", "attrs"),
    // PyCryptodome docs, "Installation": `pip install pycryptodome` installs the `Crypto` package.
    ("Crypto", "pycryptodome"),
    // PyCryptodome docs, "Installation": `pip install pycryptodomex` installs the `Cryptodome` package.
    ("Cryptodome", "pycryptodomex"),
    // PyPI project page "protobuf": Python runtime for Protocol Buffers, `google.protobuf`.
    ("google.protobuf", "protobuf"),
    // PyPI project page "google-api-python-client": imported as `googleapiclient`.
    ("googleapiclient", "google-api-python-client"),
    // PyPI project page "grpcio": the gRPC runtime, imported as `grpc`.
    ("grpc", "grpcio"),
    // PyPI project page "PyJWT": `import jwt`.
    ("jwt", "pyjwt"),
    // PyPI project page "python-dotenv": `from dotenv import load_dotenv`.
    ("dotenv", "python-dotenv"),
    // PyPI project page "python-docx": `import docx`.
    ("docx", "python-docx"),
    // PyPI project page "python-pptx": `from pptx import Presentation`.
    ("pptx", "python-pptx"),
    // PyPI project page "python-magic": `import magic`.
    ("magic", "python-magic"),
    // PyPI project page "pyserial": `import serial`.
    ("serial", "pyserial"),
    // PyPI project page "pyusb": `import usb.core`.
    ("usb", "pyusb"),
    // GitPython docs, "Overview": `pip install GitPython`, then `import git`.
    ("git", "gitpython"),
    // PyPI project page "pyOpenSSL": `from OpenSSL import SSL`.
    ("OpenSSL", "pyopenssl"),
    // PyPI project page "PyNaCl": `import nacl`.
    ("nacl", "pynacl"),
    // PyPI project page "python-jose": `from jose import jwt`.
    ("jose", "python-jose"),
    // PyPI project page "python-multipart": `import multipart` (the module Starlette forms use).
    ("multipart", "python-multipart"),
    // PyPI project page "python-slugify": `from slugify import slugify`.
    ("slugify", "python-slugify"),
    // python-telegram-bot docs: `import telegram`.
    ("telegram", "python-telegram-bot"),
    // PyMuPDF docs, "Installation": `pip install PyMuPDF`; the legacy module name is `fitz`.
    ("fitz", "pymupdf"),
    // PyPI project page "pywin32": provides `win32api`, `win32con`, `win32gui`, `win32com`, `pythoncom`.
    ("win32api", "pywin32"),
    // PyPI project page "pywin32" (see above).
    ("win32con", "pywin32"),
    // PyPI project page "pywin32" (see above).
    ("win32gui", "pywin32"),
    // PyPI project page "pywin32" (see above).
    ("win32com", "pywin32"),
    // PyPI project page "pywin32" (see above).
    ("pythoncom", "pywin32"),
    // wxPython docs: `pip install wxPython`, then `import wx`.
    ("wx", "wxpython"),
    // PyGObject docs, "Getting Started": `pip install PyGObject`, then `import gi`.
    ("gi", "pygobject"),
    // PyPI project page "pycairo": `import cairo`.
    ("cairo", "pycairo"),
    // PyPI project page "PyOpenGL": `from OpenGL.GL import *`.
    ("OpenGL", "pyopengl"),
    // PyPI project page "pyzmq": `import zmq`.
    ("zmq", "pyzmq"),
    // PyPI project page "mysqlclient": a fork of MySQLdb, `import MySQLdb`.
    ("MySQLdb", "mysqlclient"),
    // Psycopg 2 docs, "Installation": `psycopg2-binary` is the stand-alone wheel for `psycopg2`.
    ("psycopg2", "psycopg2-binary"),
    // PyPI project page "python-ldap": `import ldap`.
    ("ldap", "python-ldap"),
    // Biopython docs, "Installation": `pip install biopython`, then `import Bio`.
    ("Bio", "biopython"),
    // Matplotlib docs: `mpl_toolkits` (mplot3d, axes_grid1) ships inside matplotlib.
    ("mpl_toolkits", "matplotlib"),
    // Matplotlib docs: `pylab` is a module of matplotlib.
    ("pylab", "matplotlib"),
    // setuptools docs, "pkg_resources": shipped with setuptools.
    ("pkg_resources", "setuptools"),
    // setuptools docs: provides the `distutils` shim once CPython 3.12 removed the module.
    ("distutils", "setuptools"),
    // cffi docs: `_cffi_backend` is cffi's compiled backend module.
    ("_cffi_backend", "cffi"),
    // faiss wiki, "Installing Faiss": the CPU wheels on PyPI are `faiss-cpu`, imported as `faiss`.
    ("faiss", "faiss-cpu"),
    // UMAP docs, "Installation": `pip install umap-learn`, then `import umap`.
    ("umap", "umap-learn"),
    // PyPI project page "python-xlib": `from Xlib import display`.
    ("Xlib", "python-xlib"),
    // PyPI project page "pytest-xdist": the plugin module is `xdist`.
    ("xdist", "pytest-xdist"),
    // PyPI project page "websocket-client": `import websocket`.
    ("websocket", "websocket-client"),
    // PyPI project page "PySocks": `import socks`.
    ("socks", "pysocks"),
    // PyPI project page "kafka-python": `from kafka import KafkaProducer`.
    ("kafka", "kafka-python"),
    // PyPI project page "python-snappy": `import snappy`.
    ("snappy", "python-snappy"),
    // PyPI project page "PyHamcrest": `from hamcrest import *`.
    ("hamcrest", "pyhamcrest"),
    // dnspython docs: `pip install dnspython`, then `import dns.resolver`.
    ("dns", "dnspython"),
    // PyPI project page "python-memcached": `import memcache`.
    ("memcache", "python-memcached"),
    // GDAL docs, "Python bindings": `pip install GDAL`, then `from osgeo import gdal`.
    ("osgeo", "gdal"),
    // PyPI project page "pyshp": `import shapefile`.
    ("shapefile", "pyshp"),
    // PyMongo docs: the `bson` package ships with pymongo (do not install the unrelated `bson`).
    ("bson", "pymongo"),
    // PyMongo docs: the `gridfs` package ships with pymongo.
    ("gridfs", "pymongo"),
    // PyPI project page "ffmpeg-python": `import ffmpeg`.
    ("ffmpeg", "ffmpeg-python"),
    // PyPI project page "SpeechRecognition": `import speech_recognition as sr`.
    ("speech_recognition", "speechrecognition"),
    // PyPI project page "newspaper3k": `from newspaper import Article`.
    ("newspaper", "newspaper3k"),
    // PyPI project page "python-stdnum": `import stdnum`.
    ("stdnum", "python-stdnum"),
    // PyPI project page "PyGithub": `from github import Github`.
    ("github", "pygithub"),
    // PyPI project page "python-gitlab": `import gitlab`.
    ("gitlab", "python-gitlab"),
    // PyPI project page "odfpy": `from odf.opendocument import load`.
    ("odf", "odfpy"),
    // PyPI project page "pdfminer.six": the maintained fork, `from pdfminer.high_level import ...`.
    ("pdfminer", "pdfminer-six"),
    // camelot docs, "Installation": `pip install camelot-py`, then `import camelot`.
    ("camelot", "camelot-py"),
    // PyPI project page "tabula-py": `import tabula`.
    ("tabula", "tabula-py"),
    // PyPI project page "discord.py": `import discord`.
    ("discord", "discord-py"),
    // Django REST framework docs, "Installation": `pip install djangorestframework`.
    ("rest_framework", "djangorestframework"),
    // PyPI project page "django-cors-headers": app module `corsheaders`.
    ("corsheaders", "django-cors-headers"),
    // PyPI project page "django-environ": `import environ`.
    ("environ", "django-environ"),
    // PyPI project page "readability-lxml": `from readability import Document`.
    ("readability", "readability-lxml"),
    // PyPI project page "python-nmap": `import nmap`.
    ("nmap", "python-nmap"),
    // PyPI project page "python-whois": `import whois`.
    ("whois", "python-whois"),
    // PyPI project page "python-barcode": `import barcode`.
    ("barcode", "python-barcode"),
    // PyWavelets docs: `pip install PyWavelets`, then `import pywt`.
    ("pywt", "pywavelets"),
    // PyPI project page "dm-haiku": `import haiku as hk`.
    ("haiku", "dm-haiku"),
    // PyPI project page "dm-tree": `import tree`.
    ("tree", "dm-tree"),
    // PyPI project page "absl-py": `from absl import app`.
    ("absl", "absl-py"),
    // llama-cpp-python docs: `from llama_cpp import Llama`.
    ("llama_cpp", "llama-cpp-python"),
    // Snowflake docs, "Python connector": `pip install snowflake-connector-python`.
    ("snowflake.connector", "snowflake-connector-python"),
    // MySQL docs, "Connector/Python": `pip install mysql-connector-python`, `import mysql.connector`.
    ("mysql.connector", "mysql-connector-python"),
    // PyPI project page "python-louvain": `import community as community_louvain`.
    ("community", "python-louvain"),
    // scikit-optimize docs: `pip install scikit-optimize`, then `import skopt`.
    ("skopt", "scikit-optimize"),
    // imbalanced-learn docs: `pip install imbalanced-learn`, then `import imblearn`.
    ("imblearn", "imbalanced-learn"),
    // PyPI project page "RPi.GPIO": `import RPi.GPIO as GPIO`.
    ("RPi", "rpi-gpio"),
    // PyPI project page "factory_boy": `import factory`.
    ("factory", "factory-boy"),
    // PyPI project page "vcrpy": `import vcr`.
    ("vcr", "vcrpy"),
    // PyPI project page "python-decouple": `from decouple import config`.
    ("decouple", "python-decouple"),
    // Cython docs: `pyximport` ships with Cython.
    ("pyximport", "cython"),
    // pytest docs: `_pytest` is pytest's implementation package.
    ("_pytest", "pytest"),
];

/// Other distributions that provide the same import. When the caller asked for one of these
/// explicitly, the detected import is already satisfied and the default must not be added beside it.
const ALTERNATIVES: &[(&str, &[&str])] = &[
    // PyPI project page "opencv-python": four wheels, install only one.
    (
        "cv2",
        &[
            "opencv-python-headless",
            "opencv-contrib-python",
            "opencv-contrib-python-headless",
        ],
    ),
    // PyPI project page "Pillow-SIMD": a drop-in fork.
    ("PIL", &["pillow-simd"]),
    // Psycopg 2 docs: the source distribution builds the same module.
    ("psycopg2", &["psycopg2"]),
    // PyPI project page "faiss-gpu".
    ("faiss", &["faiss-gpu", "faiss-gpu-cu12"]),
    // PyPI project page "PyJWT" vs the older "jwt"-module forks people pin.
    ("jwt", &["jwt"]),
    // PyPI project page "pycrypto": the unmaintained original of `Crypto`.
    ("Crypto", &["pycrypto"]),
];

/// How many components of `dotted` name its distribution: 1 except for namespace packages
/// (`google.protobuf` → 2, `google.cloud.storage` → 3).
pub(crate) fn significant_depth(dotted: &str) -> usize {
    NAMESPACES
        .iter()
        .filter(|(prefix, _)| {
            dotted == *prefix
                || dotted
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('.'))
        })
        .map(|(_, depth)| *depth)
        .max()
        .unwrap_or(1)
}

/// The PyPI distribution (normalized) that provides the import `module`, as [`crate::detect_imports`]
/// reports it: a top-level name, or for namespace packages the dotted prefix that names one
/// (`google.protobuf`). Known differences come from a curated table (`PIL` → `pillow`, `sklearn` →
/// `scikit-learn`, `yaml` → `pyyaml`); otherwise the import name is the distribution name. `None` for a
/// bare namespace (`import google`), which names no distribution.
pub(crate) fn distribution_for_import(module: &str) -> Option<String> {
    if module.split('.').count() < significant_depth(module) {
        return None;
    }
    let known = DISTRIBUTIONS
        .iter()
        .find(|(import, _)| *import == module)
        .map(|(_, dist)| (*dist).to_owned());
    Some(known.unwrap_or_else(|| normalize_name(module)))
}

/// Distributions other than [`distribution_for_import`]'s answer that provide `module`.
pub(crate) fn alternatives_for_import(module: &str) -> &'static [&'static str] {
    ALTERNATIVES
        .iter()
        .find(|(import, _)| *import == module)
        .map_or(&[], |(_, dists)| dists)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn well_known_mismatches_map_to_their_distribution() {
        let cases = [
            ("PIL", "pillow"),
            ("sklearn", "scikit-learn"),
            ("yaml", "pyyaml"),
            ("cv2", "opencv-python"),
            ("bs4", "beautifulsoup4"),
            ("dateutil", "python-dateutil"),
            ("attr", "attrs"),
            ("skimage", "scikit-image"),
            ("Crypto", "pycryptodome"),
            ("google.protobuf", "protobuf"),
            ("jwt", "pyjwt"),
            ("dotenv", "python-dotenv"),
        ];
        for (import, dist) in cases {
            assert_eq!(
                distribution_for_import(import).as_deref(),
                Some(dist),
                "{import}"
            );
        }
    }

    #[test]
    fn unknown_imports_fall_back_to_their_normalized_name() {
        assert_eq!(
            distribution_for_import("tabulate").as_deref(),
            Some("tabulate")
        );
        assert_eq!(
            distribution_for_import("typing_extensions").as_deref(),
            Some("typing-extensions")
        );
        assert_eq!(
            distribution_for_import("google.genai").as_deref(),
            Some("google-genai")
        );
        assert_eq!(
            distribution_for_import("google.cloud.storage").as_deref(),
            Some("google-cloud-storage")
        );
        assert_eq!(
            distribution_for_import("zope.interface").as_deref(),
            Some("zope-interface")
        );
    }

    #[test]
    fn a_bare_namespace_names_no_distribution() {
        assert_eq!(distribution_for_import("google"), None);
        assert_eq!(distribution_for_import("google.cloud"), None);
        assert_eq!(distribution_for_import("azure"), None);
    }

    #[test]
    fn the_table_is_large_normalized_and_free_of_duplicates_and_no_ops() {
        assert!(DISTRIBUTIONS.len() >= 60, "{}", DISTRIBUTIONS.len());
        let mut seen = HashSet::new();
        for (import, dist) in DISTRIBUTIONS {
            assert!(seen.insert(*import), "{import} listed twice");
            assert_eq!(normalize_name(dist), *dist, "{dist} is not normalized");
            assert_ne!(normalize_name(import), *dist, "{import} needs no entry");
        }
        for (import, dists) in ALTERNATIVES {
            assert!(
                seen.contains(import),
                "{import} has alternatives but no entry"
            );
            for dist in *dists {
                assert_eq!(normalize_name(dist), *dist, "{dist} is not normalized");
            }
        }
    }
}
